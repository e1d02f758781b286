(ns org.apache.clojure-mxnet.util-test
  (:require [clojure.main]
            [clojure.test :refer [deftest is testing]]
            [org.apache.clojure-mxnet.kvstore :as kvstore]
            [org.apache.clojure-mxnet.util :as util]
            [org.apache.clojure-mxnet.test-util :refer [thrown]])
  (:import (io.github.kvstore KVStoreException KVStoreException$Code)))

(set! *warn-on-reflection* true)

(deftest every-code-has-a-lower-case-dashed-keyword
  (is (= {"KEY_NOT_INITIALIZED" :key-not-initialized
          "ALREADY_INITIALIZED" :already-initialized
          "SHAPE_MISMATCH" :shape-mismatch
          "DTYPE_MISMATCH" :dtype-mismatch
          "LENGTH_MISMATCH" :length-mismatch
          "UNKNOWN_STORE_KIND" :unknown-store-kind
          "DEVICE_UNAVAILABLE" :device-unavailable
          "UNSUPPORTED" :unsupported
          "INVALID_ARGUMENT" :invalid-argument
          "DISPOSED" :disposed
          "IO" :io
          "BACKEND" :backend
          "RESOURCE_EXHAUSTED" :resource-exhausted
          "INTERNAL" :internal}
         (into {} (map (fn [^KVStoreException$Code c] [(.name c) (util/code->keyword c)]))
               (KVStoreException$Code/values)))))

(deftest with-kvstore-errors-rethrows-as-ex-info-with-the-cause
  (let [cause (KVStoreException. "SHAPE_MISMATCH" "push of key \"w\": expected [2], got [3]")
        e (thrown #(util/with-kvstore-errors :push (throw cause)))]
    (is (= {:kvstore/error :shape-mismatch :kvstore/code "SHAPE_MISMATCH" :kvstore/op :push}
           (ex-data e)))
    (is (identical? cause (ex-cause e)))
    (is (= (.getMessage cause) (ex-message e))))
  (testing "an OutOfMemoryError is :resource-exhausted, with the error as cause"
    (let [oom (OutOfMemoryError. "Java heap space")
          e (thrown #(util/with-kvstore-errors :->vec (throw oom)))]
      (is (= {:kvstore/error :resource-exhausted :kvstore/code "RESOURCE_EXHAUSTED" :kvstore/op :->vec}
             (ex-data e)))
      (is (identical? oom (ex-cause e)))))
  (testing "other exceptions and values pass through"
    (is (= 3 (util/with-kvstore-errors :x (+ 1 2))))
    (is (thrown? IllegalStateException (util/with-kvstore-errors :x (throw (IllegalStateException.)))))))

(deftest validate!-throws-explain-data
  (is (nil? (util/validate! string? "a" "Invalid a")))
  (let [e (thrown #(util/validate! string? 1 "Invalid a"))]
    (is (= "Invalid a: 1" (ex-message e)) "the message shows the value")
    (is (= 1 (:clojure.spec.alpha/value (ex-data e))))
    (is (seq (:clojure.spec.alpha/problems (ex-data e))))
    (testing "and the :kvstore/error of every argument error"
      (is (= :invalid-argument (:kvstore/error (ex-data e))))
      (is (= "INVALID_ARGUMENT" (:kvstore/code (ex-data e)))))))

(deftest argument-errors-name-the-users-call
  ;; What the REPL prints (clojure.main's report of an uncaught exception) names the
  ;; function the user called, not the helper that checked its arguments.
  (let [report (fn [f] (let [e (thrown f)]
                         (clojure.main/ex-str (clojure.main/ex-triage (Throwable->map e)))))
        kv (kvstore/create "local")]
    (is (re-find #"invalid arguments to org\.apache\.clojure-mxnet\.kvstore/push" (report #(kvstore/push kv 3 :x))))
    (is (re-find #"org\.apache\.clojure-mxnet\.kvstore/pull" (report #(kvstore/pull kv 3.5))))
    (is (re-find #"org\.apache\.clojure-mxnet\.kvstore/create" (report #(kvstore/create 7))))
    (is (not (re-find #"util/validate!" (report #(kvstore/push kv 3 :x)))))))

(deftest int-value?-is-an-integer-that-fits-a-java-int
  (is (every? util/int-value? [0 -1 Integer/MAX_VALUE Integer/MIN_VALUE (int 5) (short 3)]))
  (is (not-any? util/int-value? [(inc Integer/MAX_VALUE) (dec Integer/MIN_VALUE) Long/MAX_VALUE 1.0 1N nil "1"])))

(deftest nd-seq-shape-of-nested-vectors
  (is (= [3] (util/nd-seq-shape [1 2 3])))
  (is (= [2 3] (util/nd-seq-shape [[1 2 3] [4 5 6]])))
  (is (= [1 2 1] (util/nd-seq-shape [[[1] [2]]])))
  (is (= :invalid-argument (:kvstore/error (ex-data (thrown #(util/nd-seq-shape [[1 2] [3]]))))))
  (is (= :invalid-argument (:kvstore/error (ex-data (thrown #(util/nd-seq-shape [[1 2] 3]))))))
  (is (= "Invalid N-D sequence: []" (ex-message (thrown #(util/nd-seq-shape []))))))

(deftest shown-prints-a-value-short
  (is (= "[\"a\" 3.5]" (util/shown ["a" 3.5])))
  (is (= "nil" (util/shown nil)))
  (is (= "{:wd a}" (util/shown {:wd 'a})))
  (testing "at most 20 elements and 4 levels per collection"
    (is (= "[0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 ...]" (util/shown (vec (range 100))))))
  (is (= "[[[[#]]]]" (util/shown [[[[[1]]]]])))
  (testing "at most 200 characters, the cut marked"
    (let [s (util/shown (apply str (repeat 1000 "x")))]
      (is (= 200 (count s)))
      (is (= (str "\"" (apply str (repeat 196 "x")) "...") s))))
  (testing "an infinite sequence is printed without hanging"
    (is (= "(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 ...)" (util/shown (range)))))
  (testing "a value whose printing fails still has a message"
    (is (re-matches #"a \S*proxy\$java\.lang\.Object\$\S+"
                    (util/shown (proxy [Object] [] (toString [] (throw (IllegalStateException. "no")))))))))

(deftest check-options!-names-the-unknown-options-and-lists-the-known
  (is (nil? (util/check-options! "f" [:a :b] {:a 1} {})))
  (is (nil? (util/check-options! "f" [:a :b] nil {})) "not a map: left to spec")
  (let [e (thrown #(util/check-options! "f" [:a :b] {:a 1 :c 2} {:kvstore/op :f}))]
    (is (= "unknown option :c for f; the options are :a, :b" (ex-message e)))
    (is (= {:kvstore/error :invalid-argument :kvstore/code "INVALID_ARGUMENT" :kvstore/op :f
            :unknown [:c] :options [:a :b]}
           (ex-data e))))
  (is (= "unknown options :c, \"d\" for f; the options are :a"
         (ex-message (thrown #(util/check-options! "f" [:a] (array-map :c 1 "d" 2) {}))))))
