(ns org.apache.clojure-mxnet.hardening-test
  "Regression tests of issue 11 (hardening) that reach the Clojure namespaces:
  allocations too large are `:kvstore/error` ex-infos, `set-updater` checks its
  argument when it is set, disposed arrays, and the contract items of the
  issue (calls from inside an updater, pulls into no outs, negative learning
  rates, update counters)."
  (:require [clojure.string :as string]
            [clojure.test :refer [deftest is testing]]
            [org.apache.clojure-mxnet.kvstore :as kvstore]
            [org.apache.clojure-mxnet.ndarray :as ndarray]
            [org.apache.clojure-mxnet.optimizer :as optimizer]
            [org.apache.clojure-mxnet.test-util :refer [error-of thrown]])
  (:import (clojure.lang ExceptionInfo)
           (io.github.kvstore KVStoreException Updater)))

(set! *warn-on-reflection* true)

(defn- causes
  "`t` and its causes, outermost first."
  [^Throwable t]
  (take-while some? (iterate #(.getCause ^Throwable %) t)))

(defn- nested-error
  "The `:kvstore/error` of the first ex-info among the causes of `e` (the error
  of a call made inside an updater, under the push's `:backend`)."
  [e]
  (some #(when (instance? ExceptionInfo %) (:kvstore/error (ex-data %))) (rest (causes e))))

;;; "(ndarray/arange 0 3 {:repeat 1000000000}) throws java.lang.OutOfMemoryError"

(deftest arange-too-large-is-a-kvstore-error-not-an-out-of-memory-error
  (let [e (thrown #(ndarray/arange 0 3 {:repeat 1000000000}))]
    (is (some? e) "an ex-info, not an OutOfMemoryError")
    (is (= :invalid-argument (:kvstore/error (ex-data e))) "3e9 elements: more than an array can have")
    (is (= :arange (:kvstore/op (ex-data e))))
    (is (= 3000000000 (:size (ex-data e)))))
  (is (= :invalid-argument (error-of #(ndarray/arange 0 3 {:repeat Long/MAX_VALUE}))))
  (is (= :invalid-argument (error-of #(ndarray/arange 0 3e9))))
  (testing "2e9 elements fit an array, but their values (16 GB of doubles) may not fit the heap"
    (when (> (* 8 2000000000) (.maxMemory (Runtime/getRuntime)))
      (let [data (ex-data (thrown #(ndarray/arange 0 2 {:repeat 1000000000})))]
        (is (= :resource-exhausted (:kvstore/error data)))
        (is (= "RESOURCE_EXHAUSTED" (:kvstore/code data))))
      (is (= :resource-exhausted (error-of #(ndarray/arange 0 2e9))))))
  (testing "repeat still works"
    (is (= [0.0 0.0 0.0 1.0 1.0 1.0] (ndarray/->vec (ndarray/arange 0 2 {:repeat 3}))))
    (is (= [5 5 6 6] (ndarray/->long-vec (ndarray/arange 5 7 {:repeat 2 :dtype :int64}))))
    (is (= [] (ndarray/->vec (ndarray/arange 0 0 {:repeat 5}))))))

;;; "Clojure set-updater with a keyword or a map fails at push time"

(defmulti ^:private multi-updater (fn [key _input _stored] key))

(defmethod multi-updater :default [_ input stored]
  (ndarray/+= stored (ndarray/* input 10)))

(def ^:private not-an-updater {:learning-rate 0.1})

(defn- triple-updater [_ input stored]
  (ndarray/+= stored (ndarray/* input 3)))

(deftest set-updater-checks-when-it-is-set-that-it-is-given-a-function
  (let [kv (kvstore/init (kvstore/create) "w" (ndarray/zeros [2]))
        out (ndarray/zeros [2])
        pushed (fn []
                 (kvstore/pull (kvstore/push kv "w" (ndarray/ones [2])) "w" out)
                 (ndarray/->vec out))]
    (kvstore/set-updater kv (fn [_ input stored] (ndarray/+= stored input)))
    (doseq [bad [:sgd {:a 1} #{1} [1 2] 'updater "sgd" 42 (Object.) #'not-an-updater]]
      (let [e (thrown #(kvstore/set-updater kv bad))]
        (is (= :invalid-argument (:kvstore/error (ex-data e))) (pr-str bad))
        (is (= (str "Invalid updater: " (pr-str bad)) (ex-message e)) (pr-str bad))))
    (testing "a refused updater leaves the installed one"
      (is (= [1.0 1.0] (pushed))))
    (testing "fns, multimethods, vars of fns and Java Updaters are accepted"
      (is (identical? kv (kvstore/set-updater kv multi-updater)))
      (is (= [11.0 11.0] (pushed)))
      (kvstore/set-updater kv #'triple-updater)
      (is (= [14.0 14.0] (pushed)))
      (kvstore/set-updater kv (reify Updater
                                (update [_ _key _index merged stored]
                                  (.subInPlace stored merged))))
      (is (= [13.0 13.0] (pushed))))))

;;; "shape(), dtype(), size() work after close()"

(deftest the-metadata-of-a-disposed-array-is-disposed-and-it-still-prints
  (let [a (ndarray/ones [2 3])]
    (ndarray/dispose a)
    (doseq [[op f] [[:shape ndarray/shape] [:shape-vec ndarray/shape-vec] [:size ndarray/size]
                    [:ndim ndarray/ndim] [:dtype ndarray/dtype] [:context ndarray/context]
                    [:->nd-vec ndarray/->nd-vec] [:copy ndarray/copy] [:as-type #(ndarray/as-type % :int8)]]]
      (is (= :disposed (error-of #(f a))) (name op)))
    (is (= "<NDArray closed>" (str a)))
    (is (string/includes? (pr-str a) "closed") "printing does not throw and says closed")
    (is (string/includes? (binding [*print-dup* true] (pr-str a)) "closed"))))

;;; Calls from inside an updater, pulls into no outs

(deftest init-and-set-updater-from-inside-the-stores-own-updater-fail-the-push
  (let [kv (kvstore/init (kvstore/create) "w" (ndarray/ones [2]))
        out (ndarray/zeros [2])]
    (kvstore/set-updater kv (fn [_ input stored]
                              (ndarray/copy-to input stored)
                              (kvstore/init kv "other" input)))
    (let [e (thrown #(kvstore/push kv "w" (ndarray/full [2] 3)))]
      (is (= :backend (:kvstore/error (ex-data e))))
      (is (= :invalid-argument (nested-error e))))
    (is (= :key-not-initialized (error-of #(kvstore/pull kv "other" out))))
    (kvstore/set-updater kv (fn [_ input stored]
                              (ndarray/copy-to input stored)
                              (kvstore/set-updater kv nil)))
    (let [e (thrown #(kvstore/push kv "w" (ndarray/full [2] 3)))]
      (is (= :backend (:kvstore/error (ex-data e))))
      (is (= :invalid-argument (nested-error e))))
    (is (= [1.0 1.0] (ndarray/->vec (do (kvstore/pull kv "w" out) out))) "both pushes changed nothing")))

(deftest pull-of-an-uninitialised-key-into-no-outs-is-key-not-initialized
  (let [kv (kvstore/create)]
    (is (= :key-not-initialized (error-of #(kvstore/pull kv "missing" []))))
    (is (identical? kv (kvstore/pull (kvstore/init kv "w" (ndarray/ones [2])) "w" [])))))

;;; Hyper-parameters as MXNet 1.9.1 takes them; counters that cannot wrap

(deftest sgd-with-learning-rate-minus-one-adds-each-push
  (let [kv (-> (kvstore/create)
               (kvstore/init "w" (ndarray/array [1 2] [2]))
               (kvstore/set-optimizer (optimizer/sgd {:learning-rate -1 :wd 0})))
        out (ndarray/zeros [2])]
    (kvstore/push kv "w" (ndarray/array [10 20] [2]))
    (is (= [11.0 22.0] (ndarray/->vec (do (kvstore/pull kv "w" out) out))))
    (kvstore/push kv "w" [(ndarray/array [10 20] [2]) (ndarray/array [0.5 -4] [2])])
    (is (= [21.5 38.0] (ndarray/->vec (do (kvstore/pull kv "w" out) out))))))

(deftest update-counters-beyond-2-to-the-53-are-invalid-arguments
  (is (= :invalid-argument (error-of #(optimizer/sgd {:begin-num-update Long/MAX_VALUE}))))
  (is (= :invalid-argument (error-of #(optimizer/adam {:begin-num-update (bit-shift-left 1 54)}))))
  (is (instance? io.github.kvstore.Optimizer (optimizer/sgd {:begin-num-update (bit-shift-left 1 52)}))))

(deftest kvstore-exceptions-of-every-code-keep-their-keyword
  (is (= :resource-exhausted (error-of #(ndarray/zeros [1048576 1048576 16]))))
  (is (instance? KVStoreException (.getCause ^Throwable (thrown #(ndarray/zeros [1048576 1048576 16]))))))
