(ns org.apache.clojure-mxnet.lr-scheduler
  "Learning-rate schedules for the optimizers' `:lr-scheduler` option, as in
  clojure-mxnet's `org.apache.clojure-mxnet.lr-scheduler`, over
  `io.github.kvstore.LrScheduler`.

      (optimizer/sgd {:learning-rate 0.1
                      :lr-scheduler (lr-scheduler/factor-scheduler 100 0.5)})

  clojure-mxnet had `factor-scheduler [step factor]`; this namespace adds an
  options arity to it and MXNet's other schedules: `multi-factor-scheduler`,
  `poly-scheduler` and `cosine-scheduler`. Every one takes, in its options
  map, `:base-lr` (default 0.01: where poly and cosine decay from; factor and
  multi-factor start from the optimizer's learning rate instead, as in MXNet)
  and a warm-up: `:warmup-steps` (default 0), `:warmup-begin-lr` (default 0)
  and `:warmup-mode` (`:linear`, the default, or `:constant`).

  The rate of update n follows MXNet 1.9.1's Python schedules, where n counts
  updates from 1; clojure-mxnet's Scala schedule saw n - 1, so its factor
  schedule lowered the rate one update later.

  A schedule is checked when it is made: an unknown key in the options says
  which and lists the options there are (`unknown option :stop-factor for
  factor-scheduler; the options are :stop-factor-lr, :base-lr, ...`), bad
  arguments fail spec (\"Invalid step: <the step>\", \"Invalid factor: ...\",
  \"Invalid opts: ...\", with `s/explain-data`), values out of range fail in
  the library; all are `{:kvstore/error :invalid-argument}` (for the library's
  checks: a step below 1, a factor above 1, steps that do not
  increase, a warm-up that begins above the base rate ...)."
  (:require [clojure.spec.alpha :as s]
            [org.apache.clojure-mxnet.util :as util])
  (:import (io.github.kvstore LrScheduler Optimizer)))

(set! *warn-on-reflection* true)

(s/def ::step int?)
(s/def ::factor number?)
(s/def ::steps (s/coll-of int? :kind sequential? :min-count 1))
(s/def ::max-update int?)
(s/def ::base-lr number?)
(s/def ::stop-factor-lr number?)
(s/def ::warmup-steps nat-int?)
(s/def ::warmup-begin-lr number?)
(s/def ::warmup-mode #{:linear :constant "linear" "constant"})
(s/def ::pwr number?)
(s/def ::final-lr number?)
(s/def ::common-opts (s/keys :opt-un [::base-lr ::warmup-steps ::warmup-begin-lr ::warmup-mode]))
(s/def ::factor-opts (s/merge ::common-opts (s/keys :opt-un [::stop-factor-lr])))
(s/def ::poly-opts (s/merge ::common-opts (s/keys :opt-un [::pwr ::final-lr])))
(s/def ::cosine-opts (s/merge ::common-opts (s/keys :opt-un [::final-lr])))

(def ^:private common-options [:base-lr :warmup-steps :warmup-begin-lr :warmup-mode])

(def option-names
  "The option keys each schedule takes, in the order the error of an unknown
  option lists them."
  {"factor-scheduler" (into [:stop-factor-lr] common-options)
   "multi-factor-scheduler" common-options
   "poly-scheduler" (into [:pwr :final-lr] common-options)
   "cosine-scheduler" (into [:final-lr] common-options)})

(defn- validate-opts!
  "Checks the options `opts` of the schedule `fn-name` against `spec`: an
  unknown key first, then the values."
  [fn-name spec opts]
  (util/check-options! fn-name (option-names fn-name) opts {:kvstore/op :lr-scheduler})
  (util/validate! spec opts "Invalid opts"))

(defn- finish
  "`sched` with the options common to every schedule, checked by the library."
  ^LrScheduler [^LrScheduler sched {:keys [base-lr warmup-steps warmup-begin-lr warmup-mode]}]
  (let [^LrScheduler sched (if base-lr (.baseLr sched (double base-lr)) sched)
        ^LrScheduler sched (if (or warmup-steps warmup-begin-lr warmup-mode)
                             (.warmup sched
                                      (long (or warmup-steps 0))
                                      (double (or warmup-begin-lr 0.0))
                                      (contains? #{nil :linear "linear"} warmup-mode))
                             sched)]
    ;; The schedule is checked with the optimizer that uses it: build one now, so
    ;; that a bad schedule fails here, where it was made.
    (util/with-kvstore-errors :lr-scheduler
      (.build (.lrScheduler (Optimizer/sgd) sched)))
    sched))

(defn factor-scheduler
  "Assume the weight has been updated by n times, then the learning rate will
  be base_lr * factor^(floor((n - 1) / step)), down to `:stop-factor-lr`.
   - step int, schedule learning rate after n updates (at least 1)
   - factor number, the factor for reducing the learning rate (at most 1)
   - opts `:stop-factor-lr` (default 1e-8), `:base-lr`, `:warmup-steps`,
     `:warmup-begin-lr`, `:warmup-mode`"
  ([step factor]
   (factor-scheduler step factor {}))
  ([step factor opts]
   (util/validate! ::step step "Invalid step")
   (util/validate! ::factor factor "Invalid factor")
   (validate-opts! "factor-scheduler" ::factor-opts opts)
   (let [sched (LrScheduler/factor (long step) (double factor))]
     (finish (if-let [stop (:stop-factor-lr opts)] (.stopFactorLr sched (double stop)) sched) opts))))

(defn multi-factor-scheduler
  "Multiplies the learning rate by `factor` after each update count in
  `steps` (increasing ints, the first at least 1): MXNet's
  MultiFactorScheduler. opts: `:base-lr`, `:warmup-steps`,
  `:warmup-begin-lr`, `:warmup-mode`."
  ([steps factor]
   (multi-factor-scheduler steps factor {}))
  ([steps factor opts]
   (util/validate! ::steps steps "Invalid steps")
   (util/validate! ::factor factor "Invalid factor")
   (validate-opts! "multi-factor-scheduler" ::common-opts opts)
   (finish (LrScheduler/multiFactor (long-array steps) (double factor)) opts)))

(defn poly-scheduler
  "Polynomial decay from `:base-lr` (default 0.01) to `:final-lr` (default
  0) at update `max-update`, with power `:pwr` (default 2): MXNet's
  PolyScheduler. opts also: `:warmup-steps`, `:warmup-begin-lr`,
  `:warmup-mode`."
  ([max-update]
   (poly-scheduler max-update {}))
  ([max-update opts]
   (util/validate! ::max-update max-update "Invalid max-update")
   (validate-opts! "poly-scheduler" ::poly-opts opts)
   (finish (LrScheduler/poly (long max-update) (double (:pwr opts 2)) (double (:final-lr opts 0))) opts)))

(defn cosine-scheduler
  "Half-cosine decay from `:base-lr` (default 0.01) to `:final-lr` (default
  0) at update `max-update`: MXNet's CosineScheduler. opts also:
  `:warmup-steps`, `:warmup-begin-lr`, `:warmup-mode`."
  ([max-update]
   (cosine-scheduler max-update {}))
  ([max-update opts]
   (util/validate! ::max-update max-update "Invalid max-update")
   (validate-opts! "cosine-scheduler" ::cosine-opts opts)
   (finish (LrScheduler/cosine (long max-update) (double (:final-lr opts 0))) opts)))
