(ns org.apache.clojure-mxnet.context-test
  (:require [clojure.test :refer [deftest is testing]]
            [org.apache.clojure-mxnet.context :as context]
            [org.apache.clojure-mxnet.ndarray :as ndarray])
  (:import (io.github.kvstore Context)))

(set! *warn-on-reflection* true)

(deftest cpu-defaults-to-device-0
  (let [c (context/cpu)]
    (is (instance? Context c))
    (is (= "cpu" (context/device-type c)))
    (is (= 0 (context/device-id c)))
    (is (= "cpu(0)" (str c)))))

(deftest cpu-takes-a-device-id
  (let [c (context/cpu 3)]
    (is (= "cpu" (context/device-type c)))
    (is (= 3 (context/device-id c)))
    (is (= "cpu(3)" (str c)))))

(deftest gpu-contexts-are-values-even-without-a-gpu
  (is (= "gpu" (context/device-type (context/gpu))))
  (is (= 0 (context/device-id (context/gpu))))
  (is (= 2 (context/device-id (context/gpu 2))))
  (is (= "gpu(1)" (str (context/gpu 1)))))

(deftest cpu-context-and-default-context-are-cpu-0
  (doseq [c [(context/cpu-context) (context/default-context)]]
    (is (= "cpu" (context/device-type c)))
    (is (= 0 (context/device-id c)))))

(deftest a-negative-device-id-is-invalid
  (doseq [f [context/cpu context/gpu]]
    (let [e (try (f -1) nil (catch clojure.lang.ExceptionInfo e e))]
      (is (= "Invalid device id: -1" (ex-message e)))
      (is (= :invalid-argument (:kvstore/error (ex-data e))))
      (is (contains? (ex-data e) :clojure.spec.alpha/problems)))))

(deftest a-device-id-beyond-int-range-is-invalid-not-an-overflow
  (doseq [f [context/cpu context/gpu]
          id [(inc Integer/MAX_VALUE) Long/MAX_VALUE]]
    (let [e (try (f id) nil (catch Exception e e))]
      (is (instance? clojure.lang.ExceptionInfo e) (str "device id " id ": " e))
      (is (= (str "Invalid device id: " id) (ex-message e)))
      (is (= :invalid-argument (:kvstore/error (ex-data e))))))
  (doseq [x ["cpu(2147483648)" "gpu(99999999999999999999)" [:gpu (inc Integer/MAX_VALUE)]]]
    (let [e (try (context/->context x) nil (catch Exception e e))]
      (is (= :invalid-argument (:kvstore/error (ex-data e))) (str (pr-str x) ": " e)))))

(deftest device-type-and-device-id-of-a-non-context-are-invalid-arguments
  (doseq [f [context/device-type context/device-id]
          x [nil "cpu(0)"]]
    (let [e (try (f x) nil (catch Exception e e))]
      (is (= :invalid-argument (:kvstore/error (ex-data e))) (str (pr-str x) ": " e)))))

(deftest ->context-coerces-contexts-strings-keywords-and-vectors
  (is (= "cpu(0)" (str (context/->context nil))))
  (let [c (context/cpu 2)]
    (is (identical? c (context/->context c))))
  (is (= "cpu(1)" (str (context/->context "cpu(1)"))))
  (is (= "gpu(0)" (str (context/->context "gpu"))))
  (is (= "cpu(0)" (str (context/->context :cpu))))
  (is (= "gpu(3)" (str (context/->context [:gpu 3]))))
  (testing "anything else is an invalid argument"
    (doseq [x ["tpu(0)" 7 [:cpu] :foo]]
      (let [e (try (context/->context x) nil (catch clojure.lang.ExceptionInfo e e))]
        (is (= :invalid-argument (:kvstore/error (ex-data e))) (pr-str x))))))

(deftest context?-recognises-contexts
  (is (context/context? (context/cpu)))
  (is (not (context/context? "cpu(0)"))))

(deftest arrays-on-a-gpu-need-one
  ;; The jar's library carries the CUDA backend; on a machine without a usable GPU
  ;; an array on gpu(0) is a :device-unavailable error naming the context and why.
  (let [r (try (ndarray/zeros [2] {:ctx (context/gpu 0)})
               (catch clojure.lang.ExceptionInfo e e))]
    (if (instance? clojure.lang.ExceptionInfo r)
      (do (is (= :device-unavailable (:kvstore/error (ex-data r))))
          (is (re-find #"gpu\(0\)" (ex-message r)))
          (is (re-find #"CUDA|cuda" (ex-message r)) "the message says why"))
      (is (= [0.0 0.0] (ndarray/->double-vec r)) "a GPU is there: the array works"))))
