(ns org.apache.clojure-mxnet.kvstore-test
  (:require [clojure.string :as string]
            [clojure.test :refer [deftest is testing]]
            [clojure.test.check.clojure-test :refer [defspec]]
            [clojure.test.check.generators :as gen]
            [clojure.test.check.properties :as prop]
            [org.apache.clojure-mxnet.context :as context]
            [org.apache.clojure-mxnet.kvstore :as kvstore]
            [org.apache.clojure-mxnet.ndarray :as ndarray]
            [org.apache.clojure-mxnet.test-util :refer [error-of root-cause spec-message-of thrown]])
  (:import (io.github.kvstore KVStore KVStoreException NDArray Updater)))

(set! *warn-on-reflection* true)

;;; clojure-mxnet's kvstore tests (contrib/clojure-package/test/.../kvstore_test.clj)

(deftest test-init-and-pull
  (let [kv (kvstore/create)
        shape [2 1]
        out (ndarray/zeros shape)]
    (-> kv
        (kvstore/init "3" (ndarray/ones shape))
        (kvstore/pull "3" out))
    (is (= [1.0 1.0] (ndarray/->vec out)))))

(deftest test-push-and-pull
  (let [kv (kvstore/create)
        shape [2 1]
        out (ndarray/zeros shape)]
    (-> kv
        (kvstore/init "3" (ndarray/ones shape))
        (kvstore/push "3" (ndarray/* (ndarray/ones shape) 4))
        (kvstore/pull "3" out))
    (is (= [4.0 4.0] (ndarray/->vec out)))))

(deftest two-bit-compression-carries-each-values-residual
  (let [kv (kvstore/set-gradient-compression (kvstore/create "device") {:type "2bit" :threshold 1})
        g (ndarray/array [0.5 1.5 -2.5] [3])
        out (ndarray/zeros [3])]
    (kvstore/init kv "w" out)
    (kvstore/pull (kvstore/push kv "w" g) "w" out)
    (is (= [0.0 1.0 -1.0] (ndarray/->vec out)))
    (kvstore/pull (kvstore/push kv "w" g) "w" out)
    (is (= [1.0 1.0 -1.0] (ndarray/->vec out)))
    (is (= :invalid-argument
           (:kvstore/error (ex-data (thrown #(kvstore/set-gradient-compression kv {"type" "2bit" "threshold" 0}))))))
    (is (= :unsupported
           (:kvstore/error (ex-data (thrown #(kvstore/set-gradient-compression (kvstore/create) {:type "2bit"}))))))
    (is (= "Invalid compression params" (spec-message-of #(kvstore/set-gradient-compression kv [:type "2bit"]))))))

(deftest test-aggregate
  (let [shape [4 4]
        ks ["b" "c" "d"]
        kv (kvstore/create)
        num-devs 4
        devs (mapv (fn [_] (context/cpu)) (range num-devs))
        vals (mapv #(ndarray/ones shape {:ctx %}) devs)]
    (-> kv
        (kvstore/init "a" (ndarray/zeros shape))
        (kvstore/init ks [(ndarray/zeros shape) (ndarray/zeros shape) (ndarray/zeros shape)])
        (kvstore/push "a" vals)
        (kvstore/pull "a" vals))
    (is (= 0.0 (->> vals
                    (mapv ndarray/->vec)
                    flatten
                    (map #(- % num-devs))
                    (apply +))))
    (is (= (repeat (* 4 16) 4.0) (mapcat ndarray/->vec vals)))
    (let [result (for [k ks]
                   (let [tmp-vals (mapv #(ndarray/* (ndarray/ones shape {:ctx %}) 2.0) devs)]
                     (-> kv
                         (kvstore/push k tmp-vals)
                         (kvstore/pull k tmp-vals))
                     (map ndarray/->vec tmp-vals)))]
      (is (= 0.0 (->> result
                      (flatten)
                      (map #(- % (* num-devs 2)))
                      (apply +))))
      (is (= (repeat (* 3 4 16) 8.0) (flatten result))))))

(deftest test-type
  (is (= "local" (-> (kvstore/create "local")
                     (kvstore/type)))))

(deftest test-get-numworkers
  (is (= 1 (-> (kvstore/create "local")
               (kvstore/num-workers)))))

(deftest test-get-rank
  (is (= 0 (-> (kvstore/create "local")
               (kvstore/rank)))))

;;; The tutorial (shared/seeds/clojure-kvstore-tutorial.txt), value by value

(deftest the-tutorial-gives-its-values
  (let [kv (kvstore/create "local")
        shape [2 3]
        a (ndarray/zeros shape)]
    (kvstore/init kv ["3"] [(ndarray/* (ndarray/ones shape) 2)])
    (kvstore/pull kv ["3"] [a])
    (is (= [2.0 2.0 2.0 2.0 2.0 2.0] (ndarray/->vec a)))
    (kvstore/push kv ["3"] [(ndarray/* (ndarray/ones shape) 8)])
    (kvstore/pull kv ["3"] [a])
    (is (= [8.0 8.0 8.0 8.0 8.0 8.0] (ndarray/->vec a)))
    (let [cpus [(context/cpu 0) (context/cpu 1) (context/cpu 2)]
          b [(ndarray/ones shape {:ctx (nth cpus 0)})
             (ndarray/ones shape {:ctx (nth cpus 1)})
             (ndarray/ones shape {:ctx (nth cpus 2)})]]
      (kvstore/push kv ["3" "3" "3"] b)
      (kvstore/pull kv "3" a)
      (is (= [3.0 3.0 3.0 3.0 3.0 3.0] (ndarray/->vec a))))
    (let [b [(ndarray/ones shape {:ctx (context/cpu 0)})
             (ndarray/ones shape {:ctx (context/cpu 1)})]]
      (kvstore/pull kv ["3" "3"] b)
      (is (= '([3.0 3.0 3.0 3.0 3.0 3.0] [3.0 3.0 3.0 3.0 3.0 3.0]) (map ndarray/->vec b)))
      (is (= ["cpu(0)" "cpu(1)"] (map (comp str ndarray/context) b)) "pull keeps the outs' contexts"))
    (let [ks ["5" "7" "9"]
          b [(ndarray/zeros shape) (ndarray/zeros shape) (ndarray/zeros shape)]]
      (kvstore/init kv ks [(ndarray/ones shape) (ndarray/ones shape) (ndarray/ones shape)])
      (kvstore/push kv ks [(ndarray/ones shape) (ndarray/ones shape) (ndarray/ones shape)])
      (kvstore/pull kv ks b)
      (is (= '([1.0 1.0 1.0 1.0 1.0 1.0] [1.0 1.0 1.0 1.0 1.0 1.0] [1.0 1.0 1.0 1.0 1.0 1.0])
             (map ndarray/->vec b))))))

;;; create, dispose and metadata

(deftest create-makes-a-local-store-by-default
  (let [kv (kvstore/create)]
    (is (instance? KVStore kv))
    (is (= "local" (kvstore/type kv)))))

(deftest create-takes-a-kind
  (is (= "device" (kvstore/type (kvstore/create "device")))))

(deftest create-lower-cases-the-kind
  (is (= "local" (kvstore/type (kvstore/create "LOCAL")))))

(deftest dist-sync-needs-the-mpi-jar
  ;; The suites run on the default jar; target/kvstore-mpi.jar is tested under
  ;; mpirun by kvstore-mpi/tests/jvm.rs.
  (is (false? (kvstore/mpi-supported?)))
  (let [e (thrown #(kvstore/create "dist_sync"))]
    (is (= :unsupported (:kvstore/error (ex-data e))))
    ;; The JVM's route to MPI, not a Rust program's (Cargo) or Python's (the wheel).
    (is (re-find #"kvstore-mpi jar" (ex-message e)))
    (is (re-find #"make jar FEATURES=mpi" (ex-message e)))
    (is (not (re-find #"Cargo\.toml|make python" (ex-message e)))))
  (is (= :unsupported (error-of #(kvstore/create "dist_async"))))
  (is (nil? (kvstore/finalize-mpi)) "finalize-mpi does nothing without MPI"))

(deftest create-rejects-unknown-kinds
  (is (= :unknown-store-kind (error-of #(kvstore/create "foo"))))
  (is (= "Invalid name" (spec-message-of #(kvstore/create 3)))))

(deftest dispose-returns-nil-and-later-use-is-disposed
  (let [kv (kvstore/init (kvstore/create) "a" (ndarray/ones [2]))]
    (is (nil? (kvstore/dispose kv)))
    (is (nil? (kvstore/dispose kv)) "dispose is idempotent")
    (is (= :disposed (error-of #(kvstore/pull kv "a" (ndarray/zeros [2])))))
    (is (= :disposed (error-of #(kvstore/push kv "a" (ndarray/zeros [2])))))
    (is (= :disposed (error-of #(kvstore/type kv))))))

;;; init

(deftest init-returns-the-store-and-copies-values
  (let [kv (kvstore/create)
        v (ndarray/ones [2])
        out (ndarray/zeros [2])]
    (is (identical? kv (kvstore/init kv "a" v)))
    (ndarray/+= v 10)
    (kvstore/pull kv "a" out)
    (is (= [1.0 1.0] (ndarray/->vec out)) "the store keeps a copy")))

(deftest init-takes-vectors-of-keys-and-values
  (let [kv (kvstore/create)
        outs [(ndarray/zeros [2]) (ndarray/zeros [2])]]
    (kvstore/init kv ["x" "y"] [(ndarray/ones [2]) (ndarray/full [2] 2)])
    (kvstore/pull kv ["x" "y"] outs)
    (is (= [[1.0 1.0] [2.0 2.0]] (mapv ndarray/->vec outs)))))

(deftest init-does-not-repeat-a-single-key
  (is (= :length-mismatch
         (error-of #(kvstore/init (kvstore/create) "a" [(ndarray/ones [2]) (ndarray/ones [2])])))))

(deftest init-twice-is-already-initialized
  (let [kv (kvstore/init (kvstore/create) "a" (ndarray/ones [2]))
        e (thrown #(kvstore/init kv "a" (ndarray/ones [2])))]
    (is (= :already-initialized (:kvstore/error (ex-data e))))
    (is (= "ALREADY_INITIALIZED" (:kvstore/code (ex-data e))))
    (is (= :init (:kvstore/op (ex-data e))))
    (is (instance? KVStoreException (ex-cause e)) "the Java exception is the cause")))

;;; push and pull

(deftest push-and-pull-return-the-store
  (let [kv (kvstore/init (kvstore/create) "a" (ndarray/ones [2]))]
    (is (identical? kv (kvstore/push kv "a" (ndarray/ones [2]))))
    (is (identical? kv (kvstore/push kv "a" (ndarray/ones [2]) 1)))
    (is (identical? kv (kvstore/pull kv "a" (ndarray/zeros [2]))))
    (is (identical? kv (kvstore/pull kv "a" (ndarray/zeros [2]) -1)))))

(deftest push-with-a-priority-gives-the-same-result
  (let [kv (kvstore/init (kvstore/create) "a" (ndarray/ones [2]))
        out (ndarray/zeros [2])]
    (kvstore/push kv "a" [(ndarray/ones [2]) (ndarray/full [2] 2)] 7)
    (kvstore/pull kv "a" out 3)
    (is (= [3.0 3.0] (ndarray/->vec out)))))

(deftest a-single-key-is-repeated-for-a-vector-of-values-and-outs
  (let [kv (kvstore/init (kvstore/create) "a" (ndarray/zeros [2]))
        outs [(ndarray/zeros [2]) (ndarray/zeros [2] {:ctx (context/cpu 1)}) (ndarray/zeros [2])]]
    (kvstore/push kv "a" [(ndarray/ones [2]) (ndarray/full [2] 2) (ndarray/full [2] 3)])
    (kvstore/pull kv "a" outs)
    (is (= [[6.0 6.0] [6.0 6.0] [6.0 6.0]] (mapv ndarray/->vec outs)))))

(deftest repeated-keys-are-summed-once
  ;; MXNet conformance case 8.
  (let [kv (kvstore/init (kvstore/create) ["5" "7"] [(ndarray/zeros [1]) (ndarray/zeros [1])])
        outs [(ndarray/zeros [1]) (ndarray/zeros [1]) (ndarray/zeros [1])]]
    (kvstore/push kv ["5" "5" "7"] [(ndarray/full [1] 1) (ndarray/full [1] 2) (ndarray/full [1] 10)])
    (kvstore/pull kv ["5" "7" "5"] outs)
    (is (= [[3.0] [10.0] [3.0]] (mapv ndarray/->vec outs)))))

(deftest values-from-four-cpu-devices-are-summed
  (let [kv (kvstore/init (kvstore/create) "w" (ndarray/zeros [3 2]))
        vals (mapv #(ndarray/ones [3 2] {:ctx (context/cpu %)}) (range 4))
        outs (mapv #(ndarray/zeros [3 2] {:ctx (context/cpu %)}) (range 4))]
    (kvstore/push kv "w" vals)
    (kvstore/pull kv "w" outs)
    (is (= (repeat 4 (repeat 6 4.0)) (map ndarray/->vec outs)))))

(deftest push-copies-its-values
  ;; A deliberate difference: MXNet aliased a single pushed value.
  (let [kv (kvstore/init (kvstore/create) "a" (ndarray/zeros [2]))
        g (ndarray/ones [2])
        out (ndarray/zeros [2])]
    (kvstore/push kv "a" g)
    (ndarray/set g 42)
    (kvstore/pull kv "a" out)
    (is (= [1.0 1.0] (ndarray/->vec out)))))

(deftest push-and-pull-errors-are-ex-info-with-kvstore-error
  (let [kv (kvstore/init (kvstore/create) "a" (ndarray/zeros [2 3]))]
    (is (= :key-not-initialized (error-of #(kvstore/push kv "nope" (ndarray/ones [2 3])))))
    (is (= :key-not-initialized (error-of #(kvstore/pull kv "nope" (ndarray/zeros [2 3])))))
    (is (= :shape-mismatch (error-of #(kvstore/push kv "a" (ndarray/ones [3 3])))))
    (is (= :shape-mismatch (error-of #(kvstore/pull kv "a" (ndarray/zeros [4 4])))))
    (is (= :length-mismatch (error-of #(kvstore/push kv ["a" "a"] [(ndarray/ones [2 3])]))))
    (is (= :length-mismatch (error-of #(kvstore/pull kv ["a"] [(ndarray/zeros [2 3]) (ndarray/zeros [2 3])]))))
    (let [e (thrown #(kvstore/push kv "a" (ndarray/ones [3 3])))]
      (is (= :push (:kvstore/op (ex-data e))))
      (is (string? (ex-message e)))
      (is (instance? KVStoreException (ex-cause e))))
    (testing "a failed push leaves the value as it was"
      (let [out (ndarray/full [2 3] 9)]
        (kvstore/pull kv "a" out)
        (is (= (repeat 6 0.0) (ndarray/->vec out)))))))

(deftest push-of-another-dtype-is-a-dtype-mismatch
  (let [kv (kvstore/init (kvstore/create) "a" (ndarray/zeros [2]))]
    (is (= :dtype-mismatch (error-of #(kvstore/push kv "a" (ndarray/ones [2] {:dtype :float64})))))))

(deftest errors-carry-the-key-and-what-was-expected-and-got
  (let [kv (kvstore/init (kvstore/create) "a" (ndarray/zeros [2 3]))]
    (testing "a shape mismatch: the key and the shapes as vectors of longs"
      (let [data (ex-data (thrown #(kvstore/push kv "a" (ndarray/ones [3 3]))))]
        (is (= {:kvstore/error :shape-mismatch :key "a" :expected [2 3] :got [3 3]}
               (select-keys data [:kvstore/error :key :expected :got])))
        (is (every? #(instance? Long %) (concat (:expected data) (:got data))))))
    (testing "a dtype mismatch: the dtypes as ndarray's keywords"
      (let [data (ex-data (thrown #(kvstore/push kv "a" (ndarray/ones [2 3] {:dtype :float64}))))]
        (is (= {:kvstore/error :dtype-mismatch :key "a" :expected :float32 :got :float64}
               (select-keys data [:kvstore/error :key :expected :got])))
        (is (= (:expected data) (ndarray/dtype-keyword (ndarray/dtype (ndarray/zeros [1])))))))
    (testing "a key that was never initialized"
      (let [data (ex-data (thrown #(kvstore/pull kv "nope" (ndarray/zeros [2 3]))))]
        (is (= :key-not-initialized (:kvstore/error data)))
        (is (= "nope" (:key data)))
        (is (not (contains? data :expected)))))
    (testing "a length mismatch: the lengths, and no key"
      (let [data (ex-data (thrown #(kvstore/push kv ["a" "a"] [(ndarray/ones [2 3])])))]
        (is (= {:kvstore/error :length-mismatch :expected 2 :got 1}
               (select-keys data [:kvstore/error :key :expected :got])))))
    (testing "an error of another kind has none of them"
      (let [data (ex-data (thrown #(kvstore/create "no-such-kind")))]
        (is (= :unknown-store-kind (:kvstore/error data)))
        (is (empty? (select-keys data [:key :expected :got])))))))

(deftest gpu-values-work-or-are-device-unavailable
  (let [r (try (let [kv (kvstore/init (kvstore/create "device") "g" (ndarray/zeros [2]))
                     vals [(ndarray/ones [2] {:ctx (context/gpu 0)}) (ndarray/ones [2] {:ctx (context/gpu 0)})]
                     out (ndarray/zeros [2] {:ctx (context/gpu 0)})]
                 (-> kv (kvstore/push "g" vals) (kvstore/pull "g" out))
                 (ndarray/->vec out))
               (catch clojure.lang.ExceptionInfo e (ex-data e)))]
    (if (vector? r)
      (is (= [2.0 2.0] r))
      (is (= :device-unavailable (:kvstore/error r))))))

;;; Argument validation with spec (clojure-mxnet's messages)

(deftest keys-must-be-strings-integers-or-vectors-of-them
  (let [kv (kvstore/init (kvstore/create) "3" (ndarray/zeros [1]))
        v (ndarray/ones [1])]
    (is (= "Invalid keys" (spec-message-of #(kvstore/init kv 3.0 v))) "a float is not an integer")
    (is (= "Invalid keys" (spec-message-of #(kvstore/push kv 3.5 v))))
    (is (= "Invalid keys" (spec-message-of #(kvstore/pull kv 3/2 v))))
    (is (= "Invalid keys" (spec-message-of #(kvstore/push kv '("3") [v]))) "a list is not a vector")
    (is (= "Invalid keys" (spec-message-of #(kvstore/pull kv (list "3") [v]))))
    (is (= "Invalid keys" (spec-message-of #(kvstore/push kv [3 3.0] [v v]))))
    (is (= "Invalid keys" (spec-message-of #(kvstore/pushpull kv :3 v))))
    (is (= "Invalid keys" (spec-message-of #(kvstore/broadcast kv nil v v))))
    (is (= "Invalid keys" (spec-message-of #(kvstore/pull kv 'w))))
    (let [e (thrown #(kvstore/push kv 3.5 v))]
      (is (= 3.5 (:clojure.spec.alpha/value (ex-data e))))
      (is (= :org.apache.clojure-mxnet.kvstore/ks (:clojure.spec.alpha/spec (ex-data e)))))))

(deftest spec-messages-show-the-value-given
  ;; clojure-mxnet's "Invalid <arg>", then the offending value as printed.
  (let [kv (kvstore/init (kvstore/create) "3" (ndarray/zeros [1]))
        v (ndarray/ones [1])]
    (is (= "Invalid keys: [\"a\" 3.5]" (ex-message (thrown #(kvstore/init kv ["a" 3.5] [v v])))))
    (is (= "Invalid keys: :3" (ex-message (thrown #(kvstore/push kv :3 v)))))
    (is (= "Invalid values: [1.0]" (ex-message (thrown #(kvstore/init kv "4" [1.0])))))
    (is (= "Invalid priority: 1.5" (ex-message (thrown #(kvstore/push kv "3" v 1.5)))))
    (is (= "Invalid kvstore: nil" (ex-message (thrown #(kvstore/push nil "3" v)))))
    (is (= "Invalid name: 3" (ex-message (thrown #(kvstore/create 3)))))
    (is (= "Invalid body: :body" (ex-message (thrown #(kvstore/send-command-to-servers kv 0 :body)))))
    (testing "a huge value is shortened, not printed whole"
      (let [e (thrown #(kvstore/push kv (conj (vec (range 100000)) 0.5) v))
            msg (ex-message e)]
        (is (string/starts-with? msg "Invalid keys: [0 1 2 3 "))
        (is (string/ends-with? msg "...]"))
        (is (< (count msg) 250) msg))
      (let [msg (ex-message (thrown #(kvstore/create (keyword (apply str (repeat 10000 "k"))))))]
        (is (string/starts-with? msg "Invalid name: :kkkk"))
        (is (string/ends-with? msg "..."))
        (is (<= (count msg) (+ (count "Invalid name: ") 200)) msg)))
    (testing "the data stays the invalid-argument error with spec's explain-data"
      (let [data (ex-data (thrown #(kvstore/init kv ["a" 3.5] [v v])))]
        (is (= :invalid-argument (:kvstore/error data)))
        (is (= ["a" 3.5] (:clojure.spec.alpha/value data)))
        (is (seq (:clojure.spec.alpha/problems data)))))))

;;; Integer keys, the keys of a store, pull into new arrays, printing, version

(deftest an-integer-key-is-its-decimal-string
  (let [kv (kvstore/create)
        out (ndarray/zeros [2])
        seen (atom [])]
    (kvstore/init kv 3 (ndarray/ones [2]))
    (is (= ["3"] (kvstore/keys kv)))
    (kvstore/push kv 3 (ndarray/full [2] 4))
    (kvstore/pull kv 3 out)
    (is (= [4.0 4.0] (ndarray/->vec out)))
    (kvstore/pull kv "3" out 0)
    (is (= [4.0 4.0] (ndarray/->vec out)) "3 and \"3\" are one key")
    (is (= :already-initialized (error-of #(kvstore/init kv "3" (ndarray/ones [2])))))
    (testing "in vectors, mixed with strings; repeated keys sum"
      (kvstore/init kv [5 "7"] [(ndarray/zeros [2]) (ndarray/zeros [2])])
      (kvstore/push kv [3 "3" 5] [(ndarray/ones [2]) (ndarray/ones [2]) (ndarray/full [2] 6)])
      (let [outs [(ndarray/zeros [2]) (ndarray/zeros [2]) (ndarray/zeros [2])]]
        (kvstore/pull kv ["3" 5 7] outs)
        (is (= [[2.0 2.0] [6.0 6.0] [0.0 0.0]] (mapv ndarray/->vec outs)))))
    (testing "a single integer key repeated for a vector, pushpull and broadcast"
      (let [outs [(ndarray/zeros [2]) (ndarray/zeros [2])]]
        (kvstore/broadcast kv 11 (ndarray/full [2] 11) outs)
        (is (= [[11.0 11.0] [11.0 11.0]] (mapv ndarray/->vec outs)))
        (kvstore/push kv 11 [(ndarray/ones [2]) (ndarray/ones [2])])
        (kvstore/pull kv 11 outs)
        (is (= [[2.0 2.0] [2.0 2.0]] (mapv ndarray/->vec outs)))
        (kvstore/pushpull kv [5 7] [(ndarray/full [2] 8) (ndarray/full [2] 9)] outs)
        (is (= [[8.0 8.0] [9.0 9.0]] (mapv ndarray/->vec outs))))
      (let [w (ndarray/full [2] 12)]
        (kvstore/pushpull kv 7 w)
        (is (= [12.0 12.0] (ndarray/->vec w)))))
    (testing "negative, long and big integers"
      (kvstore/init kv [-1 Long/MAX_VALUE 12N (biginteger 13) (int 14)] (vec (repeatedly 5 #(ndarray/zeros [1]))))
      (is (= ["3" "5" "7" "11" "-1" "9223372036854775807" "12" "13" "14"] (kvstore/keys kv))))
    (testing "the updater gets the string"
      (kvstore/set-updater kv (fn [key _ _] (swap! seen conj key)))
      (kvstore/push kv [7 3] [(ndarray/ones [2]) (ndarray/ones [2])])
      (is (= ["3" "7"] @seen) "in first-init order, as strings"))))

(deftest keys-are-the-keys-in-first-init-order
  (let [kv (kvstore/create)]
    (is (= [] (kvstore/keys kv)))
    (kvstore/init kv ["b" "a"] [(ndarray/zeros [1]) (ndarray/zeros [1])])
    (kvstore/broadcast kv 10 (ndarray/ones [2]) (ndarray/zeros [2]))
    (is (= ["b" "a" "10"] (kvstore/keys kv)))
    (is (vector? (kvstore/keys kv)))
    (is (= "Invalid kvstore" (spec-message-of #(kvstore/keys nil))))
    (kvstore/dispose kv)
    (is (= :disposed (error-of #(kvstore/keys kv))))))

(deftest pull-without-outs-returns-new-arrays
  (let [kv (kvstore/create)
        stored (ndarray/full [2 3] 2 {:dtype :float64 :ctx (context/cpu 1)})]
    (kvstore/init kv "w" stored)
    (let [w (kvstore/pull kv "w")]
      (is (instance? NDArray w))
      (is (= [2 3] (ndarray/shape w)))
      (is (= :float64 (ndarray/dtype-keyword (ndarray/dtype w))))
      (is (= "cpu(0)" (str (ndarray/context w))))
      (is (= (repeat 6 2.0) (ndarray/->vec w)))
      (ndarray/set w 7)
      (is (= (repeat 6 2.0) (ndarray/->vec (kvstore/pull kv "w"))) "a copy: the store keeps its value"))
    (kvstore/push kv "w" (ndarray/full [2 3] 5 {:dtype :float64}))
    (is (= (repeat 6 5.0) (ndarray/->vec (kvstore/pull kv "w"))) "the value after a push")
    (testing "integer keys and vectors of keys"
      (kvstore/init kv 4 (ndarray/full [1] 4))
      (is (= [4.0] (ndarray/->vec (kvstore/pull kv 4))))
      (let [ws (kvstore/pull kv [4 "w" "4"])]
        (is (vector? ws))
        (is (= [[4.0] (repeat 6 5.0) [4.0]] (mapv ndarray/->vec ws))))
      (is (= [] (kvstore/pull kv []))))
    (testing "errors"
      (is (= :key-not-initialized (error-of #(kvstore/pull kv "nope"))))
      (is (= :key-not-initialized (error-of #(kvstore/pull kv ["w" "nope"]))))
      (is (= "Invalid keys" (spec-message-of #(kvstore/pull kv 1.5))))
      (is (= "Invalid kvstore" (spec-message-of #(kvstore/pull nil "w")))))
    (testing "clojure-mxnet's arities are unchanged: they write into outs and return the store"
      (let [out (ndarray/zeros [1])]
        (is (identical? kv (kvstore/pull kv 4 out)))
        (is (identical? kv (kvstore/pull kv "4" out 1)))
        (is (= [4.0] (ndarray/->vec out)))))
    (kvstore/dispose kv)
    (is (= :disposed (error-of #(kvstore/pull kv "w"))))))

(deftest a-store-prints-its-kind-and-number-of-keys
  (let [kv (kvstore/create)]
    (is (= "#kvstore/store {:kind \"local\", :keys 0}" (pr-str kv)))
    (kvstore/init kv ["a" 2 "c"] [(ndarray/zeros [1]) (ndarray/zeros [1]) (ndarray/zeros [1])])
    (is (= "#kvstore/store {:kind \"local\", :keys 3}" (pr-str kv)))
    (is (= (pr-str kv) (str kv) (print-str kv) (binding [*print-dup* true] (pr-str kv))))
    (is (= "#kvstore/store {:kind \"device\", :keys 0}" (pr-str (kvstore/create "device"))))
    (is (= "[#kvstore/store {:kind \"local\", :keys 3}]" (pr-str [kv])))
    (kvstore/dispose kv)
    (is (= "#kvstore/store {:closed true}" (pr-str kv)) "a disposed store prints, never throws")))

(deftest version-is-the-workspace-version
  (let [version (kvstore/version)
        ;; The suite runs from the repository root (scripts/test-clojure.sh) or from
        ;; clojure/ (Leiningen, deps.edn).
        cargo (slurp (first (filter #(.isFile (java.io.File. ^String %)) ["Cargo.toml" "../Cargo.toml"])))
        workspace (second (re-find #"(?s)\[workspace\.package\].*?\nversion = \"([^\"]+)\"" cargo))]
    (is (string? workspace) "Cargo.toml has a workspace version")
    (is (= workspace version))
    (is (= (KVStore/version) version))))

(deftest values-and-outs-must-be-ndarrays-or-vectors-of-them
  (let [kv (kvstore/init (kvstore/create) "3" (ndarray/zeros [1]))
        v (ndarray/ones [1])]
    (is (= "Invalid values" (spec-message-of #(kvstore/init kv "4" [1.0]))))
    (is (= "Invalid values" (spec-message-of #(kvstore/push kv "3" (list v)))))
    (is (= "Invalid values" (spec-message-of #(kvstore/push kv "3" nil))))
    (is (= "Invalid outs" (spec-message-of #(kvstore/pull kv "3" [v "x"]))))
    (is (= "Invalid outs" (spec-message-of #(kvstore/pull kv "3" (list v)))))
    (is (= "Invalid values" (spec-message-of #(kvstore/pushpull kv "3" 1))))
    (is (= "Invalid outs" (spec-message-of #(kvstore/pushpull kv "3" v 1))))
    (is (= "Invalid outs" (spec-message-of #(kvstore/broadcast kv "9" v [nil]))))))

(deftest priority-head-and-body-are-validated
  (let [kv (kvstore/init (kvstore/create) "3" (ndarray/zeros [1]))
        v (ndarray/ones [1])]
    (is (= "Invalid priority" (spec-message-of #(kvstore/push kv "3" v 1.5))))
    (is (= "Invalid priority" (spec-message-of #(kvstore/pull kv "3" v "high"))))
    (is (= "Invalid priority" (spec-message-of #(kvstore/pushpull kv "3" v v nil))))
    (is (= "Invalid priority" (spec-message-of #(kvstore/broadcast kv "8" v v 0.5))))
    (is (= "Invalid head" (spec-message-of #(kvstore/send-command-to-servers kv "0" "body"))))
    (is (= "Invalid body" (spec-message-of #(kvstore/send-command-to-servers kv 0 :body))))))

(deftest argument-errors-are-ex-info-with-kvstore-error-and-explain-data
  (let [kv (kvstore/init (kvstore/create) "3" (ndarray/zeros [1]))
        v (ndarray/ones [1])]
    (doseq [[msg f] [["Invalid keys: 3.5" #(kvstore/push kv 3.5 v)]
                     ["Invalid values: [1.0]" #(kvstore/init kv "4" [1.0])]
                     ["Invalid outs: [\"x\"]" #(kvstore/pull kv "3" ["x"])]
                     ["Invalid priority: 1.5" #(kvstore/push kv "3" v 1.5)]
                     ["Invalid name: 3" #(kvstore/create 3)]
                     ["Invalid filename: nil" #(kvstore/save-optimizer-states kv nil)]]]
      (let [e (thrown f)]
        (is (= msg (ex-message e)))
        (is (= :invalid-argument (:kvstore/error (ex-data e))) msg)
        (is (= "INVALID_ARGUMENT" (:kvstore/code (ex-data e))) msg)
        (is (seq (:clojure.spec.alpha/problems (ex-data e))) (str msg ": explain-data kept"))))))

(deftest numbers-beyond-int-range-are-invalid-arguments-not-overflows
  (let [kv (kvstore/init (kvstore/create) "3" (ndarray/zeros [1]))
        v (ndarray/ones [1])
        big (inc Integer/MAX_VALUE)
        small (dec Integer/MIN_VALUE)
        outcome (fn [f] (try (f) :returned
                             (catch clojure.lang.ExceptionInfo e
                               [(ex-message e) (:kvstore/error (ex-data e))])
                             (catch Exception e (class e))))]
    (is (= ["Invalid priority: 2147483648" :invalid-argument] (outcome #(kvstore/push kv "3" v big))))
    (is (= ["Invalid priority: -2147483649" :invalid-argument] (outcome #(kvstore/pull kv "3" v small))))
    (is (= ["Invalid priority: 2147483648" :invalid-argument] (outcome #(kvstore/pushpull kv "3" v v big))))
    (is (= ["Invalid priority: 2147483648" :invalid-argument] (outcome #(kvstore/broadcast kv "8" v v big))))
    (is (= ["Invalid node-id: 2147483648" :invalid-argument] (outcome #(kvstore/num-dead-node kv big))))
    (is (= ["Invalid head: 9223372036854775807" :invalid-argument]
           (outcome #(kvstore/send-command-to-servers kv Long/MAX_VALUE "b"))))
    (testing "the int range's ends still work"
      (is (= :returned (outcome #(kvstore/push kv "3" v Integer/MAX_VALUE))))
      (is (= :returned (outcome #(kvstore/pull kv "3" v Integer/MIN_VALUE)))))))

(deftest a-nil-or-foreign-store-is-invalid-kvstore
  (let [v (ndarray/ones [1])
        calls {:dispose #(kvstore/dispose %)
               :init #(kvstore/init % "3" v)
               :push #(kvstore/push % "3" v)
               :push-priority #(kvstore/push % "3" v 0)
               :pull #(kvstore/pull % "3" v)
               :pushpull #(kvstore/pushpull % "3" v)
               :pushpull-outs #(kvstore/pushpull % "3" v v)
               :broadcast #(kvstore/broadcast % "3" v v)
               :set-updater #(kvstore/set-updater % nil)
               :type #(kvstore/type %)
               :num-workers #(kvstore/num-workers %)
               :rank #(kvstore/rank %)
               :barrier #(kvstore/barrier %)
               :num-dead-node #(kvstore/num-dead-node % 0)
               :set-barrier-before-exit #(kvstore/set-barrier-before-exit % true)
               :send-command-to-servers #(kvstore/send-command-to-servers % 0 "b")
               :set-optimizer #(kvstore/set-optimizer % nil)
               :optimizer-name #(kvstore/optimizer-name %)
               :save-optimizer-states #(kvstore/save-optimizer-states % "f")
               :load-optimizer-states #(kvstore/load-optimizer-states % "f")
               :save-checkpoint #(kvstore/save-checkpoint % "f")
               :load-checkpoint #(kvstore/load-checkpoint % "f")}]
    (doseq [[op f] calls
            store [nil "local" (ndarray/zeros [1])]]
      (let [e (try (f store) nil (catch Exception e e))]
        (is (instance? clojure.lang.ExceptionInfo e) (str op " of " (pr-str store) ": " e))
        (is (= (str "Invalid kvstore: " (pr-str store)) (ex-message e)) (str op))
        (is (= :invalid-argument (:kvstore/error (ex-data e))) (str op))))))

(deftest invalid-arguments-never-reach-the-store
  (let [kv (kvstore/init (kvstore/create) "3" (ndarray/zeros [1]))
        out (ndarray/zeros [1])]
    (is (= "Invalid values" (spec-message-of #(kvstore/push kv "3" [(ndarray/ones [1]) 2]))))
    (kvstore/pull kv "3" out)
    (is (= [0.0] (ndarray/->vec out)))))

;;; set-updater

(deftest set-updater-with-a-clojure-fn
  ;; MXNet conformance case 4: stored += 2 * input.
  (let [kv (kvstore/create)
        calls (atom [])
        out (ndarray/zeros [2 3])]
    (kvstore/init kv "3" (ndarray/full [2 3] 4))
    (is (identical? kv (kvstore/set-updater kv (fn [key input stored]
                                                  (swap! calls conj key)
                                                  (ndarray/+= stored (ndarray/* input 2))))))
    (kvstore/pull kv "3" out)
    (is (= (repeat 6 4.0) (ndarray/->vec out)) "installing an updater changes nothing")
    (kvstore/push kv "3" (ndarray/ones [2 3]))
    (kvstore/pull kv "3" out)
    (is (= (repeat 6 6.0) (ndarray/->vec out)))
    (is (= ["3"] @calls) "the updater gets the string key")))

(deftest the-updater-runs-once-per-key-with-the-sum-in-first-init-order
  ;; MXNet conformance case 9, string keys.
  (let [kv (kvstore/create)
        calls (atom [])]
    (kvstore/init kv ["b" "a"] [(ndarray/zeros [1]) (ndarray/zeros [1])])
    (kvstore/set-updater kv (fn [key input stored]
                              (swap! calls conj [key (ndarray/->vec input)])
                              (ndarray/copy-to input stored)))
    (kvstore/push kv ["a" "b" "a"] [(ndarray/full [1] 1) (ndarray/full [1] 2) (ndarray/full [1] 3)])
    (is (= [["b" [2.0]] ["a" [4.0]]] @calls))))

(deftest an-updater-that-throws-fails-the-push-and-keeps-the-value
  (let [kv (kvstore/create)
        out (ndarray/zeros [2])]
    (kvstore/init kv "w" (ndarray/full [2] 5))
    (kvstore/set-updater kv (fn [_key _input stored]
                              (ndarray/+= stored 100)
                              (throw (ex-info "updater failed" {:boom true}))))
    (let [e (thrown #(kvstore/push kv "w" (ndarray/ones [2])))]
      (is (= :backend (:kvstore/error (ex-data e))))
      (is (= :push (:kvstore/op (ex-data e))))
      (is (= {:boom true} (ex-data (root-cause e))) "the fn's exception is the root cause"))
    (kvstore/pull kv "w" out)
    (is (= [5.0 5.0] (ndarray/->vec out)))))

(deftest the-updater-arrays-are-valid-only-during-the-call
  (let [kv (kvstore/init (kvstore/create) "w" (ndarray/zeros [2]))
        kept (atom nil)]
    (kvstore/set-updater kv (fn [_ input stored]
                              (reset! kept [input stored])
                              (ndarray/+= stored input)))
    (kvstore/push kv "w" (ndarray/ones [2]))
    (is (= [:disposed :disposed] (mapv (fn [a] (error-of #(ndarray/->vec a))) @kept)))))

(deftest set-updater-nil-restores-assign
  (let [kv (kvstore/init (kvstore/create) "w" (ndarray/ones [2]))
        out (ndarray/zeros [2])]
    (kvstore/set-updater kv (fn [_ input stored] (ndarray/+= stored input)))
    (kvstore/push kv "w" (ndarray/ones [2]))
    (kvstore/pull kv "w" out)
    (is (= [2.0 2.0] (ndarray/->vec out)))
    (kvstore/set-updater kv nil)
    (kvstore/push kv "w" (ndarray/full [2] 7))
    (kvstore/pull kv "w" out)
    (is (= [7.0 7.0] (ndarray/->vec out)))))

(deftest set-updater-takes-a-java-updater
  (let [kv (kvstore/init (kvstore/create) "w" (ndarray/ones [2]))
        out (ndarray/zeros [2])
        seen (atom nil)
        u (reify Updater
            (update [_ key index merged stored]
              (reset! seen [key (integer? index)])
              (ndarray/-= stored merged)))]
    (kvstore/set-updater kv u)
    (kvstore/push kv "w" (ndarray/full [2] 3))
    (kvstore/pull kv "w" out)
    (is (= [-2.0 -2.0] (ndarray/->vec out)))
    (is (= ["w" true] @seen))))

(deftest set-updater-validates-its-argument
  (is (= "Invalid updater" (spec-message-of #(kvstore/set-updater (kvstore/create) "sgd")))))

;;; pushpull

(deftest pushpull-in-place-writes-into-the-values
  ;; MXNet conformance case 14.
  (let [kv (kvstore/init (kvstore/create) ["w" "v"] [(ndarray/zeros [2]) (ndarray/zeros [2])])
        w (ndarray/full [2] 3)]
    (is (identical? kv (kvstore/pushpull kv "w" w)))
    (is (= [3.0 3.0] (ndarray/->vec w)))
    (let [vs [(ndarray/ones [2]) (ndarray/full [2] 2)]]
      (kvstore/pushpull kv "v" vs)
      (is (= [[3.0 3.0] [3.0 3.0]] (mapv ndarray/->vec vs)) "every value gets the sum"))))

(deftest pushpull-into-outs
  (let [kv (kvstore/init (kvstore/create) ["a" "b"] [(ndarray/zeros [2]) (ndarray/zeros [2])])
        outs [(ndarray/zeros [2]) (ndarray/zeros [2])]
        in [(ndarray/full [2] 4) (ndarray/full [2] 5)]]
    (is (identical? kv (kvstore/pushpull kv ["a" "b"] in outs)))
    (is (= [[4.0 4.0] [5.0 5.0]] (mapv ndarray/->vec outs)))
    (is (= [[4.0 4.0] [5.0 5.0]] (mapv ndarray/->vec in)) "the values are unchanged")
    (is (identical? kv (kvstore/pushpull kv ["a" "b"] [(ndarray/ones [2]) (ndarray/ones [2])] outs 2)))
    (is (= [[1.0 1.0] [1.0 1.0]] (mapv ndarray/->vec outs)))))

(deftest pushpull-of-one-key-with-different-numbers-of-values-and-outs
  (let [kv (kvstore/init (kvstore/create) "a" (ndarray/zeros [2]))
        out (ndarray/zeros [2])
        outs [(ndarray/zeros [2]) (ndarray/zeros [2]) (ndarray/zeros [2])]]
    (kvstore/pushpull kv "a" [(ndarray/ones [2]) (ndarray/ones [2])] out)
    (is (= [2.0 2.0] (ndarray/->vec out)))
    (kvstore/pushpull kv "a" (ndarray/full [2] 3) outs 0)
    (is (= (repeat 3 [3.0 3.0]) (map ndarray/->vec outs)))
    (kvstore/pushpull kv "a" [(ndarray/full [2] 2) (ndarray/full [2] 3)] [out (first outs)])
    (is (= [[5.0 5.0] [5.0 5.0]] (mapv ndarray/->vec [out (first outs)])))))

(deftest pushpull-errors
  (let [kv (kvstore/init (kvstore/create) "a" (ndarray/zeros [2]))]
    (is (= :key-not-initialized (error-of #(kvstore/pushpull kv "b" (ndarray/ones [2])))))
    (is (= :shape-mismatch (error-of #(kvstore/pushpull kv "a" (ndarray/ones [2]) (ndarray/zeros [3])))))))

;;; broadcast

(deftest broadcast-inits-and-pulls
  ;; MXNet conformance case 15.
  (let [kv (kvstore/create)
        a (ndarray/zeros [2 3])
        x (ndarray/zeros [2 3])
        y (ndarray/zeros [2 3] {:ctx (context/cpu 1)})]
    (is (identical? kv (kvstore/broadcast kv "b" (ndarray/full [2 3] 2) a)))
    (is (= (repeat 6 2.0) (ndarray/->vec a)))
    (is (= :already-initialized (error-of #(kvstore/broadcast kv "b" (ndarray/full [2 3] 2) a))))
    (is (identical? kv (kvstore/broadcast kv "c" (ndarray/full [2 3] 5) [x y] 1)))
    (is (= [(repeat 6 5.0) (repeat 6 5.0)] (map ndarray/->vec [x y])))))

(deftest broadcast-of-vectors-of-keys
  (let [kv (kvstore/create)
        outs [(ndarray/zeros [1]) (ndarray/zeros [1])]]
    (kvstore/broadcast kv ["p" "q"] [(ndarray/full [1] 6) (ndarray/full [1] 7)] outs)
    (is (= [[6.0] [7.0]] (mapv ndarray/->vec outs)))
    (let [out (ndarray/zeros [1])]
      (kvstore/pull kv "q" out)
      (is (= [7.0] (ndarray/->vec out)) "broadcast initialized the key"))))

;;; The rest of the API

(deftest barrier-works-and-returns-the-store
  ;; clojure-mxnet's barrier passed the store twice.
  (let [kv (kvstore/create)]
    (is (identical? kv (kvstore/barrier kv)))))

(deftest num-dead-node-is-0-on-a-local-store
  (let [kv (kvstore/create)]
    (is (= 0 (kvstore/num-dead-node kv 4)))
    (is (= "Invalid node-id" (spec-message-of #(kvstore/num-dead-node kv "4"))))))

(deftest set-barrier-before-exit-returns-the-store
  (let [kv (kvstore/create)]
    (is (identical? kv (kvstore/set-barrier-before-exit kv false)))
    (is (identical? kv (kvstore/set-barrier-before-exit kv true)))))

(deftest send-command-to-servers-is-accepted-on-a-local-store
  (let [kv (kvstore/create)]
    (is (identical? kv (kvstore/send-command-to-servers kv 0 "hello")))))

;;; Properties

(defspec pushes-of-repeated-keys-sum-like-a-map 30
  ;; The reference model: a map from key to the integer it holds.
  (prop/for-all [pushes (gen/not-empty (gen/vector (gen/tuple (gen/elements ["k0" "k1" "k2"])
                                                              (gen/choose -100 100))))]
    (let [kv (kvstore/create)
          ks ["k0" "k1" "k2"]
          _ (kvstore/init kv ks [(ndarray/zeros [2]) (ndarray/zeros [2]) (ndarray/zeros [2])])
          _ (kvstore/push kv (mapv first pushes) (mapv #(ndarray/full [2] (second %)) pushes))
          outs [(ndarray/zeros [2]) (ndarray/zeros [2]) (ndarray/zeros [2])]
          _ (kvstore/pull kv ks outs)
          sums (reduce (fn [m [k v]] (update m k (fnil + 0) v)) {} pushes)
          expected (mapv #(let [s (get sums %)] (if s [(double s) (double s)] [0.0 0.0])) ks)]
      (kvstore/dispose kv)
      (= expected (mapv ndarray/->vec outs)))))

;;; The timeline and the counters

(deftest a-timeline-is-written-and-the-calls-are-counted
  (let [kv (kvstore/create)
        file (java.io.File/createTempFile "kvstore-timeline" ".json")
        path (.getPath file)
        out (ndarray/zeros [4])]
    (is (identical? kv (kvstore/start-timeline kv path)))
    (-> kv
        (kvstore/init ["a" "b"] [(ndarray/ones [4]) (ndarray/ones [4])])
        (kvstore/push ["a" "b" "a"] [(ndarray/ones [4]) (ndarray/ones [4]) (ndarray/ones [4])])
        (kvstore/pull "a" out))
    (is (= path (kvstore/stop-timeline kv)))
    (is (nil? (kvstore/stop-timeline kv)))
    (is (string/includes? (slurp path) "\"name\":\"push\""))
    (let [s (kvstore/stats kv)]
      (is (= {"init" {:calls 1 :keys 2} "push" {:calls 1 :keys 3} "pull" {:calls 1 :keys 1}} (:calls s)))
      (is (= [48 16 0 []] [(:bytes-pushed s) (:bytes-pulled s) (:wire-bytes-sent s) (:ranks s)]))
      (is (pos? (get-in s [:phases "sum"])))
      (is (= {:values 32 :state 0 :buffers 0} (:held s))))
    (is (identical? kv (kvstore/reset-stats kv)))
    (is (= {} (:calls (kvstore/stats kv))))
    (is (= 32 (get-in (kvstore/stats kv) [:held :values])))
    (.delete file)))

(deftest a-timeline-that-cannot-be-made-is-an-io-error
  (let [kv (kvstore/create)]
    (is (= :io (error-of #(kvstore/start-timeline kv "/nonexistent-dir/trace.json"))))
    (is (nil? (kvstore/stop-timeline kv)))
    (is (= :invalid-argument (error-of #(kvstore/start-timeline kv 3))))))

;;; Commits (the restart itself is tested from Java, in a child JVM with KVSTORE_JOB)

(deftest a-store-without-a-job-name-cannot-commit
  (let [kv (kvstore/init (kvstore/create) "w" (ndarray/ones [2]))]
    (is (= :invalid-argument (error-of #(kvstore/commit kv 0 "loader at 0"))))
    (is (= :invalid-argument (error-of #(kvstore/commit kv 0))))
    (is (= :invalid-argument (error-of #(kvstore/commit kv "zero" (byte-array 0)))))
    (is (= :invalid-argument (error-of #(kvstore/commit kv 0 [1 2]))))
    (is (nil? (kvstore/restored kv)))))
