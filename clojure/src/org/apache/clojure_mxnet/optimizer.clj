(ns org.apache.clojure-mxnet.optimizer
  "Optimizers, as in clojure-mxnet's `org.apache.clojure-mxnet.optimizer`,
  over `io.github.kvstore.Optimizer`: install one on a store with
  `kvstore/set-optimizer` and every push of gradients updates the weights.

      (-> (kvstore/create)
          (kvstore/init \"w\" (ndarray/zeros [2 2]))
          (kvstore/set-optimizer (optimizer/sgd {:learning-rate 0.1 :momentum 0.9}))
          (kvstore/push \"w\" (ndarray/ones [2 2])))   ; w is now -0.1

  clojure-mxnet's functions, with its option keys and its (Scala's) defaults:
  `sgd dcasgd nag ada-delta rms-prop ada-grad adam sgld`, each `[]` and
  `[opts]`. The other optimizers of MXNet 1.9.1, with Python's names and
  defaults (clojure-mxnet had none of them): `adamax nadam ftrl signum lamb
  lars ftml lbsgd`. Every one also takes `:rescale-gradient`, `:lr-mult` and `:wd-mult`
  (maps of key to multiplier), `:multi-precision` (a float32 master copy of
  float16 weights) and `:begin-num-update`. `:clip-gradient 0` means no
  clipping, as in clojure-mxnet. Schedules come from
  `org.apache.clojure-mxnet.lr-scheduler`.

  The update rules are MXNet 1.9.1's Python rules (the store's optimizers),
  given the defaults and options that clojure-mxnet's Scala optimizers had;
  see the comment block below for where the two differ.

  Errors are `ex-info`: an unknown key in the options (clojure-mxnet silently
  ignored a misspelt one) says which and lists the options there are
  (`unknown option :momentun for sgd; the options are :learning-rate,
  :momentum, ...`, data `{:kvstore/error :invalid-argument :unknown
  [:momentun] :options [...]}`); options that are not a map, or values of the
  wrong type, fail spec with \"Incorrect <name> optimizer options: <opts>\"
  and `s/explain-data` as data; values MXNet 1.9.1 takes are taken (a negative
  `:learning-rate` is gradient ascent: sgd with -1 and `:wd 0` adds each push
  to the weight), and what would corrupt the store fails in the library with
  `{:kvstore/error :invalid-argument}` (non-finite values, update counts such
  as `:begin-num-update` beyond 2^53); a Scala behaviour that cannot be
  reproduced fails with `{:kvstore/error :unsupported}`.

  Not provided: clojure-mxnet's `update` and `create-state`, which ran an
  optimizer on arrays outside any store; here an optimizer runs inside the
  store it is installed on."
  (:require [clojure.spec.alpha :as s]
            [org.apache.clojure-mxnet.util :as util])
  (:import (io.github.kvstore LrScheduler Optimizer Optimizer$Lbsgd Optimizer$Named)))

(set! *warn-on-reflection* true)

(comment
  ;; Where clojure-mxnet (Scala) and MXNet's Python optimizers differ, and what
  ;; this namespace does. The defaults are clojure-mxnet's in the eight
  ;; functions it had, Python's in the six others.
  ;;
  ;; Defaults                  clojure-mxnet (used here)      Python 1.9.1
  ;;   sgd, nag    wd          0.0001                          0
  ;;   sgld        wd          0.0001                          0
  ;;   adam        lr          0.002                           0.001
  ;;   ada-grad    lr          0.05                            0.01
  ;;   rms-prop    lr, gamma1  0.002, 0.95                     0.001, 0.9
  ;;               epsilon     1e-4 (a constant in Scala)      1e-8
  ;;               centered    always                          false
  ;;   ada-delta   rho, eps    0.05, 1e-8                      0.9, 1e-5
  ;;
  ;; Behaviours:
  ;; - rms-prop: Scala's RMSProp is always Graves' centered variant, with 1e-4
  ;;   under the root; here `:centered` defaults to true and `:epsilon` to 1e-4,
  ;;   so the rule is Scala's. Scala adds `wd * w` outside the root, Python
  ;;   (used here) adds it to the gradient first: they differ only when wd > 0
  ;;   (default 0). Scala ignored `:lr-scheduler` and the `:rescale-gradient`
  ;;   constructor argument; here both work.
  ;; - adam: Scala counts time steps once for all keys (it advances on the
  ;;   first key only, and restarts from 0 whenever a key's state is created);
  ;;   here each key counts its own updates, as Python does. That cannot be
  ;;   reproduced: with one key, or keys all created before the first push and
  ;;   pushed equally often, the two agree. Scala's `decay-factor` shrinks beta1
  ;;   over time; its default, 1 - 1e-8, is exactly 1 as a float (no decay),
  ;;   which is the only value accepted here (others are `:unsupported`). Scala
  ;;   decays weights by `lr * wd * w` after the step, Python (here) adds
  ;;   `wd * w` to the gradient; equal for wd 0 (the default).
  ;; - ada-delta, sgld: Scala ignored the `:rescale-gradient` argument (it read
  ;;   the optimizer's own rescale factor, always 1); here it works.
  ;; - nag: Scala keeps momentum without the learning rate, Python with it; the
  ;;   updates are the same while the rate is constant.
  ;; - dcasgd: clojure-mxnet passed `:lambda` as the momentum and `:momentum`
  ;;   as lambda (reference §0.10); fixed here.
  ;; - ada-delta: clojure-mxnet's zero-argument arity was nested inside the
  ;;   other (so `(ada-delta)` was an arity error and `(ada-delta {})` recursed
  ;;   forever); both work here.
  ;; - Schedules: Scala asked its schedule for the rate of update n - 1 (the
  ;;   count before the update), Python (here) of update n: a factor schedule
  ;;   with step s lowers the rate after s updates here, one update later in
  ;;   clojure-mxnet.
  ;; - State files (`kvstore/save-optimizer-states`) are this library's own
  ;;   format, not Scala's Java serialization.
  )

;;; Specs of the options

(s/def ::learning-rate number?)
(s/def ::momentum number?)
(s/def ::wd number?)
(s/def ::clip-gradient number?)
(s/def ::rescale-gradient number?)
(s/def ::lr-scheduler (s/nilable #(instance? LrScheduler %)))
(s/def ::lr-mult (s/map-of string? number?))
(s/def ::wd-mult (s/map-of string? number?))
(s/def ::multi-precision boolean?)
(s/def ::begin-num-update nat-int?)
(s/def ::lazy-update boolean?)
(s/def ::lambda number?)
(s/def ::rho number?)
(s/def ::epsilon number?)
(s/def ::gamma1 number?)
(s/def ::gamma2 number?)
(s/def ::centered boolean?)
(s/def ::clip-weights number?)
(s/def ::beta1 number?)
(s/def ::beta2 number?)
(s/def ::decay-factor number?)
(s/def ::seed int?)
(s/def ::lamda1 number?)
(s/def ::beta number?)
(s/def ::wd-lh number?)
(s/def ::schedule-decay number?)
(s/def ::lower-bound number?)
(s/def ::upper-bound number?)
(s/def ::bias-correction boolean?)
(s/def ::eta number?)
(s/def ::momentum-correction boolean?)
(s/def ::warmup-strategy string?)
(s/def ::warmup-epochs nat-int?)
(s/def ::batch-scale pos-int?)
(s/def ::updates-per-epoch nat-int?)
(s/def ::begin-epoch nat-int?)

(defn- only-keys?
  "Whether every key of the map `m` is in `known`."
  [known m]
  (every? known (keys m)))

(defmacro ^:private opts-spec
  "A spec of an options map: the keys `ks` (specs of this namespace), each
  optional, and no other key."
  [& ks]
  (let [known (set (map (comp keyword name) ks))]
    `(s/and (s/keys :opt-un [~@ks]) (fn [m#] (only-keys? ~known m#)))))

;; Every optimizer also takes these.
(s/def ::sgd-opts (opts-spec ::learning-rate ::momentum ::wd ::clip-gradient ::lr-scheduler ::lazy-update
                             ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::dcasgd-opts (opts-spec ::learning-rate ::momentum ::lambda ::wd ::clip-gradient ::lr-scheduler
                                ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::nag-opts (opts-spec ::learning-rate ::momentum ::wd ::clip-gradient ::lr-scheduler
                             ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::ada-delta-opts (opts-spec ::rho ::rescale-gradient ::epsilon ::wd ::clip-gradient
                                   ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::rms-prop-opts (opts-spec ::learning-rate ::rescale-gradient ::gamma1 ::gamma2 ::wd ::lr-scheduler
                                  ::clip-gradient ::epsilon ::centered ::clip-weights
                                  ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::ada-grad-opts (opts-spec ::learning-rate ::rescale-gradient ::epsilon ::wd ::clip-gradient ::lr-scheduler
                                  ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::adam-opts (opts-spec ::learning-rate ::beta1 ::beta2 ::epsilon ::decay-factor ::wd ::clip-gradient
                              ::lr-scheduler ::lazy-update
                              ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::sgld-opts (opts-spec ::learning-rate ::rescale-gradient ::wd ::clip-gradient ::lr-scheduler ::seed
                              ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::adamax-opts (opts-spec ::learning-rate ::beta1 ::beta2 ::wd ::clip-gradient ::lr-scheduler
                                ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::ftml-opts (opts-spec ::learning-rate ::beta1 ::beta2 ::epsilon ::wd ::clip-gradient ::lr-scheduler
                              ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::lbsgd-opts (opts-spec ::learning-rate ::momentum ::warmup-strategy ::warmup-epochs ::batch-scale
                               ::updates-per-epoch ::begin-epoch ::wd ::clip-gradient ::lr-scheduler
                               ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::nadam-opts (opts-spec ::learning-rate ::beta1 ::beta2 ::epsilon ::schedule-decay ::wd ::clip-gradient
                               ::lr-scheduler
                               ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::ftrl-opts (opts-spec ::learning-rate ::lamda1 ::beta ::wd ::clip-gradient ::lr-scheduler
                              ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::signum-opts (opts-spec ::learning-rate ::momentum ::wd-lh ::wd ::clip-gradient ::lr-scheduler
                                ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::lamb-opts (opts-spec ::learning-rate ::beta1 ::beta2 ::epsilon ::lower-bound ::upper-bound
                              ::bias-correction ::wd ::clip-gradient ::lr-scheduler
                              ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))
(s/def ::lars-opts (opts-spec ::learning-rate ::momentum ::eta ::epsilon ::momentum-correction ::wd
                              ::clip-gradient ::lr-scheduler
                              ::rescale-gradient ::lr-mult ::wd-mult ::multi-precision ::begin-num-update))

;;; Building

(def ^:private mxnet-names
  "MXNet's hyper-parameter name of each numeric or boolean option."
  {:learning-rate "learning_rate" :momentum "momentum" :wd "wd" :clip-gradient "clip_gradient"
   :rescale-gradient "rescale_grad" :multi-precision "multi_precision"
   :begin-num-update "begin_num_update" :lazy-update "lazy_update" :lambda "lamda" :rho "rho"
   :epsilon "epsilon" :gamma1 "gamma1" :gamma2 "gamma2" :centered "centered"
   :clip-weights "clip_weights" :beta1 "beta1" :beta2 "beta2" :seed "seed" :lamda1 "lamda1"
   :beta "beta" :wd-lh "wd_lh" :schedule-decay "schedule_decay" :lower-bound "lower_bound"
   :upper-bound "upper_bound" :bias-correction "bias_correction" :eta "eta"
   :momentum-correction "momentum_correction" :warmup-strategy "warmup_strategy"
   :warmup-epochs "warmup_epochs" :batch-scale "batch_scale" :updates-per-epoch "updates_per_epoch"
   :begin-epoch "begin_epoch"})

(defn option-names
  "The option keys that the options spec `spec` (one of this namespace's
  `::<name>-opts`) allows, in the order it lists them: what the error of an
  unknown option lists."
  [spec]
  (let [[_and keys-form] (s/form spec)]
    (mapv (comp keyword name) (:opt-un (apply hash-map (rest keys-form))))))

(defn- build
  "The optimizer `mxnet-name` (the function `fn-name` of this namespace) with
  the options `opts` (checked against `spec`: an unknown key, then the rest)
  over `defaults`. `renames` maps an option to another MXNet name than
  `mxnet-names` gives."
  (^Optimizer [fn-name mxnet-name spec opts defaults]
   (build fn-name mxnet-name spec opts defaults {}))
  (^Optimizer [fn-name mxnet-name spec opts defaults renames]
   (util/check-options! fn-name (option-names spec) opts {:kvstore/op :optimizer})
   (util/validate! spec opts (str "Incorrect " fn-name " optimizer options"))
   (let [o (merge defaults opts)
         ^Optimizer$Named b (Optimizer/builder ^String mxnet-name)]
     (doseq [[k v] o
             :when (and (some? v)
                        (contains? mxnet-names k)
                        ;; clojure-mxnet's "no clipping".
                        (not (and (= k :clip-gradient) (zero? v))))]
       (.param b ^String (get renames k (mxnet-names k))
               (double (cond (boolean? v) (if v 1 0)
                             ;; A name MXNet takes (LBSGD's warm-up), as the store's code.
                             (string? v) (Optimizer$Lbsgd/warmupStrategyCode v)
                             :else v))))
     (when-let [sched (:lr-scheduler o)]
       (.lrScheduler b ^LrScheduler sched))
     (doseq [[k m] (:lr-mult o)]
       (.lrMult b ^String k (double m)))
     (doseq [[k m] (:wd-mult o)]
       (.wdMult b ^String k (double m)))
     (util/with-kvstore-errors :optimizer
       (.build b)))))

;;; clojure-mxnet's optimizers

(defn sgd
  "A very simple SGD optimizer with momentum and weight regularization.

  Options (clojure-mxnet's defaults): `:learning-rate` 0.01, `:momentum` 0.0,
  `:wd` 0.0001 (Python: 0), `:clip-gradient` 0 (none), `:lr-scheduler` nil;
  also `:lazy-update` and the options every optimizer takes (see the ns)."
  ([opts]
   (build "sgd" "sgd" ::sgd-opts opts
          {:learning-rate 0.01 :momentum 0.0 :wd 0.0001 :clip-gradient 0}))
  ([]
   (sgd {})))

(defn dcasgd
  "DCASGD optimizer with momentum and weight regularization.
  Implementation of paper 'Asynchronous Stochastic Gradient Descent with
  Delay Compensation for Distributed Deep Learning'.

  Options (clojure-mxnet's defaults): `:learning-rate` 0.01, `:momentum` 0.0,
  `:lambda` 0.04 (the delay compensation), `:wd` 0.0, `:clip-gradient` 0,
  `:lr-scheduler` nil. Unlike clojure-mxnet, `:lambda` and `:momentum` reach
  the optimizer as themselves (it swapped them)."
  ([opts]
   (build "dcasgd" "dcasgd" ::dcasgd-opts opts
          {:learning-rate 0.01 :momentum 0.0 :lambda 0.04 :wd 0.0 :clip-gradient 0}))
  ([]
   (dcasgd {})))

(defn nag
  "SGD with Nesterov momentum.

  Options (clojure-mxnet's defaults): `:learning-rate` 0.01, `:momentum` 0.0,
  `:wd` 0.0001 (Python: 0), `:clip-gradient` 0, `:lr-scheduler` nil."
  ([opts]
   (build "nag" "nag" ::nag-opts opts
          {:learning-rate 0.01 :momentum 0.0 :wd 0.0001 :clip-gradient 0}))
  ([]
   (nag {})))

(defn ada-delta
  "AdaDelta optimizer as described in Matthew D. Zeiler, 2012.
  http://arxiv.org/abs/1212.5701 (it has no learning rate).

  Options (clojure-mxnet's defaults): `:rho` 0.05 (Python: 0.9),
  `:rescale-gradient` 1.0 (honoured; Scala ignored it), `:epsilon` 1e-8
  (Python: 1e-5), `:wd` 0.0, `:clip-gradient` 0."
  ([opts]
   (build "ada-delta" "adadelta" ::ada-delta-opts opts
          {:rho 0.05 :rescale-gradient 1.0 :epsilon 1e-8 :wd 0.0 :clip-gradient 0}))
  ([]
   (ada-delta {})))

(defn rms-prop
  "RMSProp optimizer as described in Tieleman & Hinton, 2012, in the centered
  form of Alex Graves, 2013, http://arxiv.org/pdf/1308.0850v5.pdf
  Eq(38) - Eq(45).

  Options (clojure-mxnet's defaults): `:learning-rate` 0.002 (Python: 0.001),
  `:rescale-gradient` 1.0, `:gamma1` 0.95 (decay of the moving averages;
  Python: 0.9), `:gamma2` 0.9 (momentum), `:wd` 0.0, `:clip-gradient` 0,
  `:lr-scheduler` nil (Scala ignored it; honoured here). Additions:
  `:epsilon` 1e-4 (Scala's constant; Python: 1e-8), `:centered` true (Scala
  was always centered; Python defaults to false), `:clip-weights`."
  ([opts]
   (build "rms-prop" "rmsprop" ::rms-prop-opts opts
          {:learning-rate 0.002 :rescale-gradient 1.0 :gamma1 0.95 :gamma2 0.9 :wd 0.0
           :clip-gradient 0 :epsilon 1e-4 :centered true}))
  ([]
   (rms-prop {})))

(defn ada-grad
  "AdaGrad optimizer as described in Duchi, Hazan and Singer, 2011.
  http://www.jmlr.org/papers/volume12/duchi11a/duchi11a.pdf

  Options (clojure-mxnet's defaults): `:learning-rate` 0.05 (Python: 0.01),
  `:rescale-gradient` 1.0, `:epsilon` 1e-7, `:wd` 0.0. Additions:
  `:clip-gradient` 0, `:lr-scheduler` nil."
  ([opts]
   (build "ada-grad" "adagrad" ::ada-grad-opts opts
          {:learning-rate 0.05 :rescale-gradient 1.0 :epsilon 1e-7 :wd 0.0}
          {:epsilon "eps"}))
  ([]
   (ada-grad {})))

(defn adam
  "Adam optimizer as described in [King2014]

  [King2014] Diederik Kingma, Jimmy Ba,
  Adam: A Method for Stochastic Optimization,
  http://arxiv.org/abs/1412.6980

  Options (clojure-mxnet's defaults): `:learning-rate` 0.002 (Python: 0.001),
  `:beta1` 0.9, `:beta2` 0.999, `:epsilon` 1e-8, `:decay-factor` (- 1 1e-8),
  `:wd` 0, `:clip-gradient` 0, `:lr-scheduler` nil.

  Each key counts its own time steps (Python's Adam; Scala shared one counter
  across keys, which cannot be reproduced). `:decay-factor` must be 1 as a
  float, which its default is; any other value is `{:kvstore/error
  :unsupported}`."
  ([opts]
   (let [decay (:decay-factor opts (- 1 1e-8))]
     (when (and (number? decay) (not= (float decay) (float 1.0)))
       (throw (ex-info (str "adam: decay-factor " decay " is not supported: Python's Adam, which this "
                            "library runs, has no beta1 decay (only the default, 1 - 1e-8, which is 1 as a float)")
                       {:kvstore/error :unsupported
                        :kvstore/code "UNSUPPORTED"
                        :kvstore/op :optimizer
                        :decay-factor decay}))))
   (build "adam" "adam" ::adam-opts opts
          {:learning-rate 0.002 :beta1 0.9 :beta2 0.999 :epsilon 1e-8 :wd 0 :clip-gradient 0}))
  ([]
   (adam {})))

(defn sgld
  "Stochastic Langevin Dynamics Updater to sample from a distribution.

  Options (clojure-mxnet's defaults): `:learning-rate` 0.01,
  `:rescale-gradient` 1 (honoured; Scala ignored it), `:wd` 0.0001 (Python:
  0), `:clip-gradient` 0, `:lr-scheduler` nil. Addition: `:seed` 0 (the same
  seed gives the same noise)."
  ([opts]
   (build "sgld" "sgld" ::sgld-opts opts
          {:learning-rate 0.01 :rescale-gradient 1 :wd 0.0001 :clip-gradient 0}))
  ([]
   (sgld {})))

;;; MXNet's other optimizers (Python's names and defaults)

(defn adamax
  "Adamax, the infinity-norm variant of Adam (Kingma and Ba, 2014, section 7).

  Options (Python's defaults): `:learning-rate` 0.002, `:beta1` 0.9, `:beta2`
  0.999, `:wd` 0, `:clip-gradient` 0, `:lr-scheduler` nil."
  ([opts]
   (build "adamax" "adamax" ::adamax-opts opts {}))
  ([]
   (adamax {})))

(defn ftml
  "FTML, Follow the Moving Leader (Zheng and Kwok, 2017).

  Options (Python's defaults): `:learning-rate` 0.01, `:beta1` 0.6, `:beta2`
  0.999, `:epsilon` 1e-8, `:wd` 0, `:clip-gradient` 0, `:lr-scheduler` nil."
  ([opts]
   (build "ftml" "ftml" ::ftml-opts opts {}))
  ([]
   (ftml {})))

(defn lbsgd
  "LBSGD, large-batch SGD: each key's gradients are summed over `:batch-scale`
  pushes, and the push that completes a batch updates the weight with their
  mean, the rate scaled by the warm-up multiplier (or, for `\"lars\"`, the
  key's trust ratio).

  Options (Python's defaults): `:learning-rate` 0.01, `:momentum` 0,
  `:warmup-strategy` \"linear\" (\"power2\", \"sqrt\", \"lars\"; any other name
  scales by 1, as in MXNet), `:warmup-epochs` 5, `:batch-scale` 1,
  `:updates-per-epoch` 32, `:begin-epoch` 0, `:wd` 0, `:clip-gradient` 0,
  `:lr-scheduler` nil."
  ([opts]
   (build "lbsgd" "lbsgd" ::lbsgd-opts opts {}))
  ([]
   (lbsgd {})))

(defn nadam
  "Nadam, Adam with Nesterov momentum (Dozat, 2016). Its momentum schedule is
  shared by all keys, as in MXNet.

  Options (Python's defaults): `:learning-rate` 0.001, `:beta1` 0.9, `:beta2`
  0.999, `:epsilon` 1e-8, `:schedule-decay` 0.004, `:wd` 0, `:clip-gradient`
  0, `:lr-scheduler` nil."
  ([opts]
   (build "nadam" "nadam" ::nadam-opts opts {}))
  ([]
   (nadam {})))

(defn ftrl
  "FTRL-Proximal (McMahan et al., 2013).

  Options (Python's defaults): `:learning-rate` 0.1, `:lamda1` 0.01 (the L1
  strength), `:beta` 1, `:wd` 0, `:clip-gradient` 0, `:lr-scheduler` nil."
  ([opts]
   (build "ftrl" "ftrl" ::ftrl-opts opts {}))
  ([]
   (ftrl {})))

(defn signum
  "Signum, the sign of the momentum (Bernstein et al., 2018); signSGD with
  `:momentum` 0.

  Options (Python's defaults): `:learning-rate` 0.01, `:momentum` 0.9,
  `:wd-lh` 0 (decoupled weight decay), `:wd` 0, `:clip-gradient` 0,
  `:lr-scheduler` nil."
  ([opts]
   (build "signum" "signum" ::signum-opts opts {}))
  ([]
   (signum {})))

(defn lamb
  "LAMB, layer-wise adaptive moments (You et al., 2019).

  Options (Python's defaults): `:learning-rate` 0.001, `:beta1` 0.9, `:beta2`
  0.999, `:epsilon` 1e-6, `:lower-bound` and `:upper-bound` (of the weight
  norm in the trust ratio; none), `:bias-correction` true, `:wd` 0,
  `:clip-gradient` 0, `:lr-scheduler` nil."
  ([opts]
   (build "lamb" "lamb" ::lamb-opts opts {}))
  ([]
   (lamb {})))

(defn lars
  "LARS, layer-wise adaptive rate scaling (You et al., 2017).

  Options (Python's defaults): `:learning-rate` 0.01, `:momentum` 0, `:eta`
  0.001, `:epsilon` 0, `:momentum-correction` true, `:wd` 0, `:clip-gradient`
  0, `:lr-scheduler` nil."
  ([opts]
   (build "lars" "lars" ::lars-opts opts {} {:epsilon "eps"}))
  ([]
   (lars {})))
