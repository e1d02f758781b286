(ns org.apache.clojure-mxnet.sparse-test
  (:require [clojure.string :as string]
            [clojure.test :refer [deftest is testing]]
            [org.apache.clojure-mxnet.kvstore :as kvstore]
            [org.apache.clojure-mxnet.ndarray :as ndarray]
            [org.apache.clojure-mxnet.optimizer :as optimizer]
            [org.apache.clojure-mxnet.sparse :as sparse]
            [org.apache.clojure-mxnet.test-util :refer [error-of spec-message-of]]))

(set! *warn-on-reflection* true)

(defn- rsp [rows data shape]
  (sparse/row-sparse-array (ndarray/array data (into [(count rows)] (rest shape))) rows shape))

(deftest row-sparse-arrays-convert-and-check-their-indices
  (let [a (rsp [0 2] [1 2 3 4] [4 2])
        d (sparse/to-dense a)
        back (sparse/from-dense d)
        z (sparse/zeros [5 3] {:dtype :float64})]
    (is (sparse/row-sparse? a))
    (is (= [1.0 2.0 0.0 0.0 3.0 4.0 0.0 0.0] (ndarray/->vec d)))
    (is (= [0 2] (sparse/indices back)))
    (is (= [4 2] (sparse/shape back)))
    (is (= [0 3] (ndarray/shape (sparse/data z))))
    (is (= :float64 (ndarray/dtype-keyword (ndarray/dtype (sparse/data z)))))
    (testing "bad arrays are errors"
      (is (= :invalid-argument (error-of #(rsp [1 0] [1 1 1 1] [3 2]))))
      (is (= :invalid-argument (error-of #(rsp [0 3] [1 1 1 1] [3 2]))))
      (is (= :invalid-argument (error-of #(sparse/row-sparse-array (ndarray/ones [2 2]) [0] [3 2]))))
      (is (= "Invalid indices" (spec-message-of #(sparse/row-sparse-array (ndarray/ones [1 2]) [:a] [3 2]))))
      (is (= "Invalid shape" (spec-message-of #(sparse/zeros []))))
      (is (= "Invalid row-sparse array" (spec-message-of #(sparse/indices (ndarray/ones [2]))))))))

(deftest row-sparse-keys-push-sum-row-wise-and-pull-only-the-rows-asked
  (let [kv (kvstore/create)]
    (kvstore/init kv "e" (sparse/from-dense (ndarray/ones [3 2])))
    (is (= :row-sparse (kvstore/stype kv "e")))
    (let [got (kvstore/row-sparse-pull kv "e" [2 0 2])]
      (is (= [0 2] (sparse/indices got)))
      (is (= [1.0 1.0 1.0 1.0] (ndarray/->vec (sparse/data got)))))
    (kvstore/push kv "e" [(rsp [0] [1 1] [3 2]) (rsp [0 2] [2 2 3 3] [3 2])])
    (is (= [3.0 3.0 0.0 0.0 3.0 3.0] (ndarray/->vec (kvstore/pull kv "e"))))
    (testing "vectors of keys; a key twice is summed"
      (kvstore/init kv ["x" 5] [(sparse/zeros [4 1]) (sparse/zeros [2 2])])
      (kvstore/push kv ["x" 5 "x"] [(rsp [3] [1] [4 1]) (rsp [1] [2 2] [2 2]) (rsp [0 3] [4 5] [4 1])])
      (is (= [4.0 0.0 0.0 6.0] (ndarray/->vec (kvstore/pull kv "x"))))
      (let [[x five] (kvstore/row-sparse-pull kv ["x" 5] [[3] [1 0]])]
        (is (= [[3] [6.0]] [(sparse/indices x) (ndarray/->vec (sparse/data x))]))
        (is (= [0 1] (sparse/indices five)))))
    (testing "empty ids"
      (is (= [] (sparse/indices (kvstore/row-sparse-pull kv "e" [])))))))

(deftest lazy-sgd-changes-only-the-pushed-rows
  (let [kv (kvstore/create)]
    (kvstore/init kv "w" (ndarray/ones [3 2]))
    (is (= :default (kvstore/stype kv "w")))
    (kvstore/set-optimizer kv (optimizer/sgd {:learning-rate 1.0 :wd 0.1}))
    (kvstore/push kv "w" (rsp [1] [0.5 0.5] [3 2]))
    (let [r (double (- (float 0.9) (float 0.5)))]
      (is (= [1.0 1.0 r r 1.0 1.0] (ndarray/->vec (kvstore/pull kv "w")))))))

(deftest bad-row-sparse-calls-are-errors-and-change-nothing
  (let [kv (kvstore/create)
        good (rsp [0] [9 9] [3 2])]
    (kvstore/init kv "e" (sparse/from-dense (ndarray/ones [3 2])))
    (kvstore/init kv "d" (ndarray/ones [3]))
    (let [before (ndarray/->vec (kvstore/pull kv "e"))]
      (is (= :shape-mismatch (error-of #(kvstore/push kv ["e" "e"] [good (rsp [0] [1 1 1] [3 3])]))))
      (is (= :key-not-initialized (error-of #(kvstore/push kv ["e" "nope"] [good good]))))
      (is (= before (ndarray/->vec (kvstore/pull kv "e")))))
    (is (= :invalid-argument (error-of #(kvstore/row-sparse-pull kv "d" [0]))))
    (is (= :invalid-argument (error-of #(kvstore/row-sparse-pull kv "e" [3]))))
    (is (= :key-not-initialized (error-of #(kvstore/row-sparse-pull kv "nope" [0]))))
    (is (= :key-not-initialized (error-of #(kvstore/stype kv "nope"))))
    (is (= "Invalid row-ids" (spec-message-of #(kvstore/row-sparse-pull kv "e" [0.5]))))
    (is (= "Invalid row-ids" (spec-message-of #(kvstore/row-sparse-pull kv ["e" "e"] [[0]]))))
    (is (= "Invalid values" (spec-message-of #(kvstore/push kv "e" [good (ndarray/ones [3 2])]))))
    (is (= "Invalid values" (spec-message-of #(kvstore/push-async kv "e" good))))))

(deftest a-closed-row-sparse-array-still-prints-and-says-closed
  (let [a (rsp [1] [1 2] [3 2])]
    (is (= "RowSparse[3, 2] FLOAT32 rows=[1]" (str a)))
    (sparse/close a)
    (is (= "<RowSparse closed>" (str a)))
    (is (string/includes? (pr-str a) "<RowSparse closed>"))
    (is (= :disposed (error-of #(sparse/to-dense a))) "the rest is still disposed")))

(deftest row-ids-and-indices-that-do-not-fit-a-long-are-refused-not-wrapped
  (let [kv (kvstore/create)
        too-big (+ (bigint Long/MAX_VALUE) 1)
        wraps-to-3 (+ (.shiftLeft BigInteger/ONE 64) (biginteger 3))]
    (kvstore/init kv ["e" "f"] [(sparse/from-dense (ndarray/ones [4 2])) (sparse/from-dense (ndarray/ones [4 2]))])
    (testing "row ids: 2^64 + 3 is not row 3"
      (is (= "Invalid row-ids" (spec-message-of #(kvstore/row-sparse-pull kv "e" [(bigint wraps-to-3)]))))
      (is (= "Invalid row-ids" (spec-message-of #(kvstore/row-sparse-pull kv "e" [wraps-to-3]))))
      (is (= "Invalid row-ids" (spec-message-of #(kvstore/row-sparse-pull kv "e" [0 too-big]))))
      (is (= "Invalid row-ids" (spec-message-of #(kvstore/row-sparse-pull kv ["e" "f"] [[0] [too-big]]))))
      (is (= :invalid-argument (error-of #(kvstore/row-sparse-pull kv "e" [(- (bigint Long/MIN_VALUE) 1)])))))
    (testing "indices"
      (is (= "Invalid indices" (spec-message-of #(sparse/row-sparse-array (ndarray/ones [1 2]) [(bigint wraps-to-3)] [4 2]))))
      (is (= "Invalid indices" (spec-message-of #(sparse/row-sparse-array (ndarray/ones [1 2]) [too-big] [4 2])))))
    (testing "big integers that fit are taken as they are"
      (is (= [3] (sparse/indices (kvstore/row-sparse-pull kv "e" [3N]))))
      (is (= [1 3] (sparse/indices (kvstore/row-sparse-pull kv "e" [(biginteger 3) (bigint 1)]))))
      (is (= [2] (sparse/indices (sparse/row-sparse-array (ndarray/ones [1 2]) [2N] [4 2])))))))
