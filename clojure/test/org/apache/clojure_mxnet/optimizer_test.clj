(ns org.apache.clojure-mxnet.optimizer-test
  (:require [clojure.java.io :as io]
            [clojure.string :as string]
            [clojure.test :refer [deftest is testing]]
            [org.apache.clojure-mxnet.kvstore :as kvstore]
            [org.apache.clojure-mxnet.lr-scheduler :as lr-scheduler]
            [org.apache.clojure-mxnet.ndarray :as ndarray]
            [org.apache.clojure-mxnet.optimizer :as optimizer]
            [org.apache.clojure-mxnet.test-util :refer [error-of spec-message-of thrown]])
  (:import (io.github.kvstore Optimizer)
           (java.io File)
           (java.nio.file Files)
           (java.nio.file.attribute FileAttribute)))

(set! *warn-on-reflection* true)

(defn- close?
  "Whether every element of the vector `v` is within 1e-6 of `expected`."
  [expected v]
  (and (seq v) (every? #(< (Math/abs (- (double expected) (double %))) 1e-6) v)))

(defn- one-step
  "The weights after one push of `grad` (everywhere) onto weights `w0` with `opt`."
  ([opt] (one-step opt 1.0 1.0))
  ([opt w0 grad]
   (let [out (ndarray/zeros [2 2])]
     (-> (kvstore/create)
         (kvstore/init "w" (ndarray/full [2 2] w0))
         (kvstore/set-optimizer opt)
         (kvstore/push "w" (ndarray/full [2 2] grad))
         (kvstore/pull "w" out))
     (ndarray/->vec out))))

(defn- temp-file
  "A path `name` in a new temporary folder (the file does not exist yet)."
  ^File [name]
  (let [dir (.toFile (Files/createTempDirectory "kvstore-optimizer-test" (make-array FileAttribute 0)))]
    (.deleteOnExit dir)
    (doto (io/file dir ^String name) (.deleteOnExit))))

;;; clojure-mxnet's optimizer tests (contrib/clojure-package/test/.../optimizer_test.clj),
;;; with a store instead of a module

(deftest test-optimizer-update
  (doseq [[opt-name optimizer-fn mxnet-name] [["sgd" optimizer/sgd "sgd"]
                                              ["dcasgd" optimizer/dcasgd "dcasgd"]
                                              ["nag" optimizer/nag "nag"]
                                              ["ada-delta" optimizer/ada-delta "adadelta"]
                                              ["rms-prop" optimizer/rms-prop "rmsprop"]
                                              ["ada-grad" optimizer/ada-grad "adagrad"]
                                              ["adam" optimizer/adam "adam"]
                                              ["sgld" optimizer/sgld "sgld"]
                                              ["adamax" optimizer/adamax "adamax"]
                                              ["nadam" optimizer/nadam "nadam"]
                                              ["ftrl" optimizer/ftrl "ftrl"]
                                              ["signum" optimizer/signum "signum"]
                                              ["lamb" optimizer/lamb "lamb"]
                                              ["lars" optimizer/lars "lars"]
                                              ["ftml" optimizer/ftml "ftml"]
                                              ["lbsgd" optimizer/lbsgd "lbsgd"]]]
    (testing opt-name
      (let [opt (optimizer-fn)
            kv (kvstore/create)]
        (is (instance? Optimizer opt))
        (is (identical? kv (kvstore/set-optimizer kv opt)))
        (is (= mxnet-name (kvstore/optimizer-name kv)))
        (let [w (one-step opt)]
          (is (every? #(and (Double/isFinite %) (not= 1.0 %)) w) (str opt-name " left " w))
          (when-not (= "sgld" opt-name)
            (is (every? #(< % 1.0) w) (str opt-name " moved the weight up: " w))))))))

(deftest test-optimizers-parameters-specs
  (is (= "Incorrect sgd optimizer options" (spec-message-of #(optimizer/sgd {:wd 'a}))))
  (is (= "Incorrect dcasgd optimizer options" (spec-message-of #(optimizer/dcasgd {:lambda 'a}))))
  (is (= "Incorrect nag optimizer options" (spec-message-of #(optimizer/nag {:momentum 'a}))))
  (is (= "Incorrect ada-delta optimizer options" (spec-message-of #(optimizer/ada-delta {:epsilon 'a}))))
  (is (= "Incorrect rms-prop optimizer options" (spec-message-of #(optimizer/rms-prop {:gamma1 'a}))))
  (is (= "Incorrect ada-grad optimizer options" (spec-message-of #(optimizer/ada-grad {:rescale-gradient 'a}))))
  (is (= "Incorrect adam optimizer options" (spec-message-of #(optimizer/adam {:beta1 'a}))))
  (is (= "Incorrect sgld optimizer options" (spec-message-of #(optimizer/sgld {:lr-scheduler 0.1}))))
  (is (= "Incorrect lamb optimizer options" (spec-message-of #(optimizer/lamb {:bias-correction 1}))))
  (is (= "Incorrect sgd optimizer options" (spec-message-of #(optimizer/sgd nil))))
  (is (= "Incorrect sgd optimizer options: {:wd a}" (ex-message (thrown #(optimizer/sgd {:wd 'a})))))
  (testing "the explain-data names the key and the value"
    (let [problems (:clojure.spec.alpha/problems (ex-data (thrown #(optimizer/adam {:beta1 "0.9"}))))]
      (is (= [[:beta1]] (map :path problems)))
      (is (= ["0.9"] (map :val problems))))))

(def ^:private constructors
  "Every optimizer constructor, by name."
  {"sgd" optimizer/sgd "dcasgd" optimizer/dcasgd "nag" optimizer/nag "ada-delta" optimizer/ada-delta
   "rms-prop" optimizer/rms-prop "ada-grad" optimizer/ada-grad "adam" optimizer/adam "sgld" optimizer/sgld
   "adamax" optimizer/adamax "nadam" optimizer/nadam "ftrl" optimizer/ftrl "signum" optimizer/signum
   "lamb" optimizer/lamb "lars" optimizer/lars "ftml" optimizer/ftml
   "lbsgd" optimizer/lbsgd})

(deftest an-unknown-option-is-named-with-the-options-there-are
  ;; clojure-mxnet silently ignored a misspelt option.
  (let [e (thrown #(optimizer/sgd {:learning-rate 0.1 :momentun 0.9}))]
    (is (= (str "unknown option :momentun for sgd; the options are :learning-rate, :momentum, :wd, "
                ":clip-gradient, :lr-scheduler, :lazy-update, :rescale-gradient, :lr-mult, :wd-mult, "
                ":multi-precision, :begin-num-update")
           (ex-message e)))
    (is (= {:kvstore/error :invalid-argument :kvstore/code "INVALID_ARGUMENT" :kvstore/op :optimizer
            :unknown [:momentun]
            :options [:learning-rate :momentum :wd :clip-gradient :lr-scheduler :lazy-update :rescale-gradient
                      :lr-mult :wd-mult :multi-precision :begin-num-update]}
           (ex-data e))))
  (is (= "unknown option :rho for rms-prop; the options are :learning-rate, :rescale-gradient, :gamma1, :gamma2, :wd, :lr-scheduler, :clip-gradient, :epsilon, :centered, :clip-weights, :lr-mult, :wd-mult, :multi-precision, :begin-num-update"
         (ex-message (thrown #(optimizer/rms-prop {:rho 0.9})))))
  (is (= "unknown option \"learning-rate\" for adam; the options are :learning-rate, :beta1, :beta2, :epsilon, :decay-factor, :wd, :clip-gradient, :lr-scheduler, :lazy-update, :rescale-gradient, :lr-mult, :wd-mult, :multi-precision, :begin-num-update"
         (ex-message (thrown #(optimizer/adam {"learning-rate" 0.1})))))
  (testing "every constructor: the message names it and the key, and lists only options it takes"
    (doseq [[fn-name f] constructors]
      (let [e (thrown #(f {:no-such-option 1}))
            {:keys [unknown options] :as data} (ex-data e)]
        (is (= :invalid-argument (:kvstore/error data)) fn-name)
        (is (= [:no-such-option] unknown) fn-name)
        (is (= (str "unknown option :no-such-option for " fn-name "; the options are "
                    (string/join ", " options))
               (ex-message e)))
        (is (some #{:wd} options) fn-name)
        (is (not-any? #{:no-such-option} options) fn-name)
        (testing "each option listed is taken"
          (doseq [k options
                  :let [v (case k
                            (:lr-scheduler) nil
                            (:lr-mult :wd-mult) {}
                            (:multi-precision :lazy-update :centered :bias-correction :momentum-correction) false
                            (:decay-factor) (- 1 1e-8)
                            (:begin-num-update :seed :warmup-epochs :updates-per-epoch :begin-epoch) 0
                            (:batch-scale) 2
                            (:warmup-strategy) "sqrt"
                            0.5)]]
            (is (instance? Optimizer (f {k v})) (str fn-name " " k)))))))
  (testing "two unknown options"
    (is (re-find #"^unknown options :a, :b for nag; the options are :learning-rate, "
                 (ex-message (thrown #(optimizer/nag (array-map :a 1 :b 2)))))))
  (testing "a known option with a bad value is still spec's error"
    (is (= "Incorrect nag optimizer options" (spec-message-of #(optimizer/nag {:momentum "0.9"}))))))

(deftest an-unknown-schedule-option-is-named-with-the-options-there-are
  (let [e (thrown #(lr-scheduler/factor-scheduler 10 0.5 {:stop-factor 1e-4}))]
    (is (= (str "unknown option :stop-factor for factor-scheduler; the options are :stop-factor-lr, :base-lr, "
                ":warmup-steps, :warmup-begin-lr, :warmup-mode")
           (ex-message e)))
    (is (= :invalid-argument (:kvstore/error (ex-data e))))
    (is (= :lr-scheduler (:kvstore/op (ex-data e)))))
  (is (= "unknown option :stop-factor-lr for multi-factor-scheduler; the options are :base-lr, :warmup-steps, :warmup-begin-lr, :warmup-mode"
         (ex-message (thrown #(lr-scheduler/multi-factor-scheduler [2 3] 0.5 {:stop-factor-lr 1e-4})))))
  (is (= "unknown option :power for poly-scheduler; the options are :pwr, :final-lr, :base-lr, :warmup-steps, :warmup-begin-lr, :warmup-mode"
         (ex-message (thrown #(lr-scheduler/poly-scheduler 10 {:power 2})))))
  (is (= "unknown option :pwr for cosine-scheduler; the options are :final-lr, :base-lr, :warmup-steps, :warmup-begin-lr, :warmup-mode"
         (ex-message (thrown #(lr-scheduler/cosine-scheduler 10 {:pwr 2})))))
  (testing "each option listed is taken"
    (doseq [[fn-name f] {"factor-scheduler" #(lr-scheduler/factor-scheduler 10 0.5 %)
                         "multi-factor-scheduler" #(lr-scheduler/multi-factor-scheduler [2 3] 0.5 %)
                         "poly-scheduler" #(lr-scheduler/poly-scheduler 10 %)
                         "cosine-scheduler" #(lr-scheduler/cosine-scheduler 10 %)}
            k (lr-scheduler/option-names fn-name)
            :let [v (case k
                      :warmup-mode :linear
                      :warmup-steps 2
                      :base-lr 0.1
                      0.001)]]
      (is (some? (f {k v})) (str fn-name " " k)))))

;;; Values: clojure-mxnet's defaults through MXNet's rules

(deftest sgd-with-clojure-mxnet-defaults-has-its-weight-decay
  ;; lr 0.01, wd 0.0001: w = (1 - lr wd) w - lr g
  (is (close? (- (* 1 (- 1 (* 0.01 0.0001))) 0.01) (one-step (optimizer/sgd))))
  (is (close? -0.01 (one-step (optimizer/sgd) 0.0 1.0)) "reference case 12 on zeros")
  (is (close? (- 1 (* 0.01 (+ 1 0.0001))) (one-step (optimizer/nag))) "nag without momentum"))

(deftest sgd-with-momentum-gives-reference-case-13
  (let [kv (kvstore/create)
        w0 (ndarray/zeros [2 3])
        w1 (ndarray/zeros [2 3])
        g0 (ndarray/ones [2 3])
        g1 (ndarray/full [2 3] 2)]
    (-> kv
        (kvstore/init ["w1" "w0"] [(ndarray/ones [2 3]) (ndarray/ones [2 3])])
        (kvstore/set-optimizer (optimizer/sgd {:learning-rate 0.1 :momentum 0.9 :wd 0}))
        (kvstore/push ["w0" "w1"] [g0 g1])
        (kvstore/push ["w0" "w1"] [g0 g1])
        (kvstore/pull ["w0" "w1"] [w0 w1]))
    (is (close? 0.71 (ndarray/->vec w0)))
    (is (close? 0.42 (ndarray/->vec w1)))))

(deftest dcasgd-passes-lambda-and-momentum-in-their-places
  (let [two-steps (fn [opt]
                    (let [out (ndarray/zeros [2])]
                      (-> (kvstore/create)
                          (kvstore/init "w" (ndarray/ones [2]))
                          (kvstore/set-optimizer opt)
                          (kvstore/push "w" (ndarray/ones [2]))
                          (kvstore/push "w" (ndarray/ones [2]))
                          (kvstore/pull "w" out))
                      (ndarray/->vec out)))]
    ;; Momentum 0.9 and no delay compensation: SGD with momentum, 1 - 0.1 - 0.19.
    (is (close? 0.71 (two-steps (optimizer/dcasgd {:learning-rate 0.1 :momentum 0.9 :lambda 0}))))
    ;; Lambda 0.9 and no momentum: 0.9, then 0.9 - 0.1 (1 + 0.9 * 1 * (0.9 - 1)).
    ;; clojure-mxnet swapped the two, giving these results the other way round.
    (is (close? 0.809 (two-steps (optimizer/dcasgd {:learning-rate 0.1 :momentum 0 :lambda 0.9}))))))

(deftest rms-prop-is-scalas-centered-rule
  ;; n = 0.05 g^2, gbar = 0.05 g, delta = -lr g / sqrt(n - gbar^2 + 1e-4), lr 0.002.
  (let [n 0.05 gbar 0.05
        expected (- 1 (/ 0.002 (Math/sqrt (+ (- n (* gbar gbar)) 1e-4))))]
    (is (close? expected (one-step (optimizer/rms-prop)))))
  (testing "Python's plain RMSProp on request: w - lr g / sqrt(n + eps)"
    (is (close? (- 1 (/ 0.001 (Math/sqrt (+ 0.1 1e-8))))
                (one-step (optimizer/rms-prop {:learning-rate 0.001 :gamma1 0.9 :centered false :epsilon 1e-8}))))))

(deftest adam-ada-grad-and-ada-delta-have-clojure-mxnets-defaults
  ;; adam, lr 0.002, t 1: lr sqrt(1 - beta2) / (1 - beta1) * m / (sqrt(v) + eps) = 0.002 (almost)
  (let [lr-t (/ (* 0.002 (Math/sqrt (- 1 0.999))) (- 1 0.9))
        step (/ (* lr-t 0.1) (+ (Math/sqrt 0.001) 1e-8))]
    (is (close? (- 1 step) (one-step (optimizer/adam)))))
  ;; ada-grad, lr 0.05: w - lr g / sqrt(g^2 + 1e-7)
  (is (close? (- 1 (/ 0.05 (Math/sqrt (+ 1 1e-7)))) (one-step (optimizer/ada-grad))))
  ;; ada-delta, rho 0.05, eps 1e-8: w - sqrt(eps) / sqrt(0.95 g^2 + eps) g
  (is (close? (- 1 (/ (Math/sqrt 1e-8) (Math/sqrt (+ 0.95 1e-8)))) (one-step (optimizer/ada-delta))))
  (testing "rescale-gradient reaches ada-delta (Scala ignored it)"
    (is (close? (- 1 (* 0.5 (/ (Math/sqrt 1e-8) (Math/sqrt (+ (* 0.95 0.25) 1e-8)))))
                (one-step (optimizer/ada-delta {:rescale-gradient 0.5})))))
  (testing "the zero-argument arity of ada-delta works (clojure-mxnet's was broken)"
    (is (instance? Optimizer (optimizer/ada-delta)))))

(deftest out-of-range-values-and-what-cannot-be-reproduced-are-kvstore-errors
  (testing "what MXNet 1.9.1 accepts is accepted"
    (is (instance? Optimizer (optimizer/sgd {:momentum 1.5})))
    (is (instance? Optimizer (optimizer/adam {:learning-rate -1})))
    (is (instance? Optimizer (optimizer/sgd {:clip-gradient -1}))))
  (is (= :invalid-argument (error-of #(optimizer/sgd {:learning-rate Double/NaN}))))
  (is (= :invalid-argument (error-of #(optimizer/sgd {:begin-num-update 100000000000000000000N}))))
  (is (= :invalid-argument (error-of #(optimizer/sgd {:begin-num-update Long/MAX_VALUE}))))
  (is (= :unsupported (error-of #(optimizer/adam {:decay-factor 0.9}))))
  (is (= 0.9 (:decay-factor (ex-data (thrown #(optimizer/adam {:decay-factor 0.9}))))))
  (is (instance? Optimizer (optimizer/adam {:decay-factor (- 1 1e-8)})))
  (is (instance? Optimizer (optimizer/adam {:decay-factor 1}))))

(deftest per-key-multipliers-and-clipping
  (let [out (ndarray/zeros [2])
        kv (-> (kvstore/create)
               (kvstore/init ["a" "b"] [(ndarray/zeros [2]) (ndarray/zeros [2])])
               (kvstore/set-optimizer (optimizer/sgd {:learning-rate 0.1 :wd 0 :lr-mult {"b" 2.0}
                                                      :clip-gradient 0.5 :rescale-gradient 2})))]
    ;; 2 * 3 = 6, clipped to 0.5
    (kvstore/push kv ["a" "b"] [(ndarray/full [2] 3) (ndarray/full [2] 3)])
    (is (close? -0.05 (ndarray/->vec (do (kvstore/pull kv "a" out) out))))
    (is (close? -0.1 (ndarray/->vec (do (kvstore/pull kv "b" out) out))))))

;;; Schedules

(deftest factor-scheduler-lowers-the-rate-every-step-updates
  (let [out (ndarray/zeros [2])
        kv (-> (kvstore/create)
               (kvstore/init "w" (ndarray/zeros [2]))
               (kvstore/set-optimizer (optimizer/sgd {:learning-rate 1 :wd 0
                                                      :lr-scheduler (lr-scheduler/factor-scheduler 2 0.5)})))
        w-after (fn [] (kvstore/push kv "w" (ndarray/ones [2])) (kvstore/pull kv "w" out) (first (ndarray/->vec out)))]
    ;; rates 1, 1, 0.5, 0.5, 0.25
    (is (= [-1.0 -2.0 -2.5 -3.0 -3.25] (vec (repeatedly 5 w-after))))))

(deftest the-other-schedules-reach-the-optimizer
  (let [rates (fn [sched n]
                (let [out (ndarray/zeros [1])
                      kv (-> (kvstore/create)
                             (kvstore/init "w" (ndarray/zeros [1]))
                             (kvstore/set-optimizer (optimizer/sgd {:learning-rate 1 :wd 0 :lr-scheduler sched})))]
                  (vec (for [_ (range n)]
                         (let [before (do (kvstore/pull kv "w" out) (first (ndarray/->vec out)))]
                           (kvstore/push kv "w" (ndarray/ones [1]))
                           (kvstore/pull kv "w" out)
                           (- before (first (ndarray/->vec out))))))))
        close-all? (fn [expected actual]
                     (every? true? (map #(< (Math/abs (- (double %1) (double %2))) 1e-6) expected actual)))]
    (is (close-all? [1 1 0.1 0.01 0.01] (rates (lr-scheduler/multi-factor-scheduler [2 3] 0.1) 5)))
    ;; poly from base-lr 1 to 0 over 4 updates, pwr 1: 0.75 0.5 0.25 0
    (is (close-all? [0.75 0.5 0.25 0.0] (rates (lr-scheduler/poly-scheduler 4 {:pwr 1 :base-lr 1}) 4)))
    (is (close-all? [0.5 0.0] (rates (lr-scheduler/cosine-scheduler 2 {:base-lr 1}) 2)))
    ;; a constant warm-up of 2 updates at 0.001, then the factor schedule
    (is (close-all? [0.001 1 1]
                    (rates (lr-scheduler/factor-scheduler 5 0.5 {:warmup-steps 2 :warmup-begin-lr 0.001
                                                                 :warmup-mode :constant :base-lr 1})
                           3)))))

(deftest bad-schedules-fail-where-they-are-made
  (is (= "Invalid step" (spec-message-of #(lr-scheduler/factor-scheduler "10" 0.5))))
  (is (= "Invalid factor" (spec-message-of #(lr-scheduler/factor-scheduler 10 nil))))
  (is (= "Invalid steps" (spec-message-of #(lr-scheduler/multi-factor-scheduler [] 0.5))))
  (is (= "Invalid opts" (spec-message-of #(lr-scheduler/poly-scheduler 10 {:warmup-mode :cubic}))))
  (is (= "Invalid opts: {:warmup-mode :cubic}"
         (ex-message (thrown #(lr-scheduler/poly-scheduler 10 {:warmup-mode :cubic})))))
  (is (= "Invalid step: \"10\"" (ex-message (thrown #(lr-scheduler/factor-scheduler "10" 0.5)))))
  (is (= :invalid-argument (error-of #(lr-scheduler/factor-scheduler 0 0.5))))
  (is (= :invalid-argument (error-of #(lr-scheduler/factor-scheduler 10 1.5))))
  (is (= :invalid-argument (error-of #(lr-scheduler/multi-factor-scheduler [5 2] 0.5))))
  (is (= :invalid-argument (error-of #(lr-scheduler/cosine-scheduler 10 {:warmup-steps 10}))))
  (is (= :invalid-argument (error-of #(lr-scheduler/cosine-scheduler 10 {:warmup-steps 2 :warmup-begin-lr 0.5}))))
  (is (= :lr-scheduler (:kvstore/op (ex-data (thrown #(lr-scheduler/factor-scheduler 0 0.5)))))))

;;; kvstore's set-optimizer, save-optimizer-states, load-optimizer-states

(defn- train!
  "Pushes 0.5 to \"a\" and \"b\" `n` times; the weights of \"a\" then \"b\"."
  [kv n]
  (let [out (ndarray/zeros [2 2])]
    (dotimes [_ n]
      (kvstore/push kv ["a" "b"] [(ndarray/full [2 2] 0.5) (ndarray/full [2 2] 0.5)]))
    [(ndarray/->vec (do (kvstore/pull kv "a" out) out))
     (ndarray/->vec (do (kvstore/pull kv "b" out) out))]))

(defn- stateful []
  (optimizer/sgd {:learning-rate 0.1 :momentum 0.9 :lr-scheduler (lr-scheduler/multi-factor-scheduler [2 3] 0.5)}))

(deftest saved-states-loaded-into-a-fresh-store-continue-identically
  (let [file (str (temp-file "sgd.states"))
        kv (-> (kvstore/create)
               (kvstore/init ["a" "b"] [(ndarray/ones [2 2]) (ndarray/ones [2 2])])
               (kvstore/set-optimizer (stateful)))
        [a b] (train! kv 2)]
    (is (identical? kv (kvstore/save-optimizer-states kv file)))
    (let [expected (train! kv 3)
          fresh (-> (kvstore/create)
                    (kvstore/init ["a" "b"] [(ndarray/array a [2 2]) (ndarray/array b [2 2])])
                    (kvstore/set-optimizer (stateful)))
          unloaded (-> (kvstore/create)
                       (kvstore/init ["a" "b"] [(ndarray/array a [2 2]) (ndarray/array b [2 2])])
                       (kvstore/set-optimizer (stateful)))]
      (is (identical? fresh (kvstore/load-optimizer-states fresh file)))
      (is (= expected (train! fresh 3)))
      (is (not= expected (train! unloaded 3)) "without the file the momentum starts afresh"))))

(deftest a-checkpoint-resumes-training-exactly-in-a-fresh-store
  (let [file (str (temp-file "store.ckpt"))
        kv (-> (kvstore/create)
               (kvstore/init ["a" "b"] [(ndarray/ones [2 2]) (ndarray/ones [2 2])])
               (kvstore/set-optimizer (stateful)))]
    (train! kv 2)
    (is (identical? kv (kvstore/save-checkpoint kv file)))
    (let [expected (train! kv 3)
          fresh (kvstore/create "device")]
      (is (identical? fresh (kvstore/load-checkpoint fresh file)))
      (is (= "sgd" (kvstore/optimizer-name fresh)))
      (is (= expected (train! fresh 3))))
    (testing "errors"
      (is (= "Invalid filename" (spec-message-of #(kvstore/save-checkpoint kv 42))))
      (is (= "Invalid filename" (spec-message-of #(kvstore/load-checkpoint kv nil))))
      (is (= :io (error-of #(kvstore/load-checkpoint kv (str file ".missing")))))
      (spit file "not a checkpoint")
      (is (= :io (error-of #(kvstore/load-checkpoint (kvstore/create) file))))
      (is (= :load-checkpoint (:kvstore/op (ex-data (thrown #(kvstore/load-checkpoint kv file)))))))))

(deftest state-files-errors
  (let [kv (-> (kvstore/create) (kvstore/init "a" (ndarray/ones [2])))
        file (temp-file "bad.states")]
    (testing "clojure-mxnet's spec message"
      (is (= "Invalid filename" (spec-message-of #(kvstore/save-optimizer-states kv 42))))
      (is (= "Invalid filename" (spec-message-of #(kvstore/load-optimizer-states kv nil))))
      (is (= "Invalid optimizer" (spec-message-of #(kvstore/set-optimizer kv "sgd")))))
    (testing "no optimizer to save"
      (is (nil? (kvstore/optimizer-name kv)))
      (is (= :invalid-argument (error-of #(kvstore/save-optimizer-states kv (str file))))))
    (kvstore/set-optimizer kv (optimizer/sgd {:momentum 0.5}))
    (testing "missing and corrupted files"
      (is (= :io (error-of #(kvstore/load-optimizer-states kv (str file)))))
      (spit file "not an optimizer-state file")
      (is (= :io (error-of #(kvstore/load-optimizer-states kv (str file)))))
      (is (= :load-optimizer-states (:kvstore/op (ex-data (thrown #(kvstore/load-optimizer-states kv (str file))))))))
    (testing "a file of another optimizer"
      (let [other (-> (kvstore/create)
                      (kvstore/init "a" (ndarray/ones [2]))
                      (kvstore/set-optimizer (optimizer/adam))
                      (kvstore/push "a" (ndarray/ones [2])))]
        (kvstore/save-optimizer-states other (str file))
        (is (= :invalid-argument (error-of #(kvstore/load-optimizer-states kv (str file)))))))))

(deftest lars-takes-epsilon-as-mxnets-eps
  (let [opt (optimizer/lars {:epsilon 1e-9 :eta 0.002})]
    (is (= "lars" (.name ^io.github.kvstore.Optimizer opt)))
    (is (re-find #"\"eps\": 1(\.0)?E-9" (.toJson ^io.github.kvstore.Optimizer opt)))))

(deftest lbsgd-takes-its-warm-up-strategy-by-name
  (is (= 3.0 (get (.params ^Optimizer (optimizer/lbsgd {:warmup-strategy "lars" :batch-scale 2})) "warmup_strategy")))
  (is (= 4.0 (get (.params ^Optimizer (optimizer/lbsgd {:warmup-strategy "constant"})) "warmup_strategy")))
  (is (thrown? clojure.lang.ExceptionInfo (optimizer/lbsgd {:batch-scale 0}))))
