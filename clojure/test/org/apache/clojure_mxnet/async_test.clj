(ns org.apache.clojure-mxnet.async-test
  "The non-blocking calls: pending values, their errors, pending outs, order."
  (:require [clojure.test :refer [deftest is testing]]
            [org.apache.clojure-mxnet.kvstore :as kvstore]
            [org.apache.clojure-mxnet.ndarray :as ndarray]
            [org.apache.clojure-mxnet.test-util :refer [error-of thrown]]))

(set! *warn-on-reflection* true)

(defn- slow-assign
  "An updater that assigns after a pause: keeps calls queued for a while."
  [_key merged stored]
  (Thread/sleep 20)
  (ndarray/copy-to merged stored))

(deftest push-async-and-pull-async-return-at-once-and-reads-wait
  (let [kv (kvstore/create)
        out (ndarray/zeros [2 1])
        release (java.util.concurrent.CountDownLatch. 1)]
    (kvstore/init kv "3" (ndarray/zeros [2 1]))
    ;; The updater waits until the test lets it go: had the calls blocked, they
    ;; would have waited out the latch's 10 s.
    (kvstore/set-updater kv (fn [_ merged stored]
                              (.await release 10 java.util.concurrent.TimeUnit/SECONDS)
                              (ndarray/copy-to merged stored)))
    (let [t0 (System/nanoTime)
          pushed (kvstore/push-async kv "3" (ndarray/* (ndarray/ones [2 1]) 4))
          pulled (kvstore/pull-async kv "3" out)]
      (is (< (- (System/nanoTime) t0) 5e9) "the calls returned at once")
      (is (not (realized? pushed)))
      (is (not (realized? pulled)))
      (.countDown release)
      ;; Reading the out waits for the pull, which comes after the push.
      (is (= [4.0 4.0] (ndarray/->vec out)))
      (is (identical? kv @pushed))
      (is (identical? kv (deref pulled 10000 :timeout))))))

(deftest deref-throws-the-ex-info-of-the-blocking-call
  (let [kv (kvstore/create)]
    (kvstore/init kv "w" (ndarray/ones [2]))
    (testing "a key not initialized, as pull throws it"
      (let [p (kvstore/pull-async kv "nope" (ndarray/zeros [2]))]
        (is (= :key-not-initialized (error-of #(deref p))))
        (is (= (error-of #(kvstore/pull kv "nope" (ndarray/zeros [2])))
               (error-of #(deref p 1000 :timeout))))))
    (testing "a shape mismatch carries the key and shapes"
      (let [e (thrown #(deref (kvstore/push-async kv "w" (ndarray/zeros [3]))))]
        (is (= :shape-mismatch (:kvstore/error (ex-data e))))
        (is (= "w" (:key (ex-data e))))))
    (testing "nothing changed"
      (is (= [1.0 1.0] (ndarray/->vec (kvstore/pull kv "w")))))
    (testing "spec errors come at once, as in the blocking call"
      (is (= :invalid-argument (error-of #(kvstore/push-async kv "w" nil)))))))

(deftest deref-with-a-timeout-gives-the-timeout-value-while-the-call-runs
  (let [kv (kvstore/create)
        release (java.util.concurrent.CountDownLatch. 1)]
    (kvstore/init kv "w" (ndarray/zeros [2]))
    (kvstore/set-updater kv (fn [_ merged stored]
                              (.await release 10 java.util.concurrent.TimeUnit/SECONDS)
                              (ndarray/copy-to merged stored)))
    (let [p (kvstore/push-async kv "w" (ndarray/ones [2]))]
      (is (= :timeout (deref p 10 :timeout)))
      (.countDown release)
      (is (identical? kv @p)))))

(deftest calls-on-one-key-take-effect-in-order-and-wait-all-waits
  (let [kv (kvstore/create)
        out (ndarray/zeros [2])]
    (kvstore/init kv "w" (ndarray/zeros [2]))
    (kvstore/set-updater kv (fn [_ merged stored] (ndarray/+= stored merged)))
    (let [ps (doall (for [i (range 1 21)]
                      (kvstore/push-async kv "w" (ndarray/* (ndarray/ones [2]) i) (mod i 3))))
          pulled (kvstore/pushpull-async kv "w" [] [out])]
      (is (identical? kv (kvstore/wait-all kv)))
      (is (every? realized? (cons pulled ps)))
      (is (identical? kv @pulled))
      (is (= [210.0 210.0] (ndarray/->vec out))))))

(deftest every-form-matches-its-blocking-twin
  (let [a (kvstore/create)
        b (kvstore/create)
        v [(ndarray/* (ndarray/ones [2]) 1.5) (ndarray/* (ndarray/ones [2]) -2)]
        outs-a [(ndarray/zeros [2]) (ndarray/zeros [2])]
        outs-b [(ndarray/zeros [2]) (ndarray/zeros [2])]]
    (doseq [kv [a b]]
      (kvstore/init kv ["x" "y"] [(ndarray/zeros [2]) (ndarray/zeros [2])]))
    (kvstore/pushpull a ["x" "y"] v outs-a)
    @(kvstore/pushpull-async b ["x" "y"] v outs-b)
    (is (= (map ndarray/->vec outs-a) (map ndarray/->vec outs-b)))
    (kvstore/broadcast a "z" (first v) outs-a)
    @(kvstore/broadcast-async b "z" (first v) outs-b)
    (is (= (map ndarray/->vec outs-a) (map ndarray/->vec outs-b)))
    (kvstore/push a "x" v)
    @(kvstore/push-async b "x" v)
    (kvstore/pull a ["x" "z"] outs-a)
    @(kvstore/pull-async b ["x" "z"] outs-b)
    (is (= (map ndarray/->vec outs-a) (map ndarray/->vec outs-b)))
    (let [in-place (ndarray/ones [2])]
      @(kvstore/pushpull-async b "y" in-place)
      (is (= [1.0 1.0] (ndarray/->vec in-place))))))

(deftest a-disposed-array-is-the-ex-info-of-the-blocking-call-thrown-at-once
  (let [kv (kvstore/create)
        gone (ndarray/zeros [2])
        live (ndarray/zeros [2])]
    (kvstore/init kv ["x" "y"] [(ndarray/zeros [2]) (ndarray/zeros [2])])
    (ndarray/dispose gone)
    (doseq [[op blocking non-blocking]
            [[:push #(kvstore/push kv "x" gone) #(kvstore/push-async kv "x" gone)]
             [:push #(kvstore/push kv ["x" "y"] [live gone]) #(kvstore/push-async kv ["x" "y"] [live gone])]
             [:pull #(kvstore/pull kv "x" gone) #(kvstore/pull-async kv "x" gone)]
             [:pull #(kvstore/pull kv ["x" "y"] [live gone]) #(kvstore/pull-async kv ["x" "y"] [live gone])]
             [:pushpull #(kvstore/pushpull kv "x" gone) #(kvstore/pushpull-async kv "x" gone)]
             [:pushpull #(kvstore/pushpull kv "x" live gone) #(kvstore/pushpull-async kv "x" live gone)]
             [:broadcast #(kvstore/broadcast kv "z" gone live) #(kvstore/broadcast-async kv "z" gone live)]
             [:broadcast #(kvstore/broadcast kv "z" live gone) #(kvstore/broadcast-async kv "z" live gone)]]]
      (let [e (thrown non-blocking)]
        (is (instance? clojure.lang.ExceptionInfo e) (str (name op) "-async throws ex-info"))
        (is (= {:kvstore/error :disposed :kvstore/code "DISPOSED" :kvstore/op op}
               (select-keys (ex-data e) [:kvstore/error :kvstore/code :kvstore/op])))
        (is (= (error-of blocking) (error-of non-blocking)))))
    (testing "nothing was made: the keys keep their values, z is not initialised"
      (is (= [0.0 0.0] (ndarray/->vec (kvstore/pull kv "x"))))
      (is (= ["x" "y"] (kvstore/keys kv))))))
