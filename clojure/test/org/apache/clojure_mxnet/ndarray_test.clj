(ns org.apache.clojure-mxnet.ndarray-test
  (:require [clojure.edn :as edn]
            [clojure.test :refer [deftest is testing]]
            [clojure.test.check.clojure-test :refer [defspec]]
            [clojure.test.check.generators :as gen]
            [clojure.test.check.properties :as prop]
            [org.apache.clojure-mxnet.context :as context]
            [org.apache.clojure-mxnet.ndarray :as ndarray]
            [org.apache.clojure-mxnet.test-util :refer [error-of spec-message-of]])
  (:import (io.github.kvstore DType NDArray)))

(set! *warn-on-reflection* true)

(def ^:private all-dtypes
  [:float32 :float64 :float16 :bfloat16 :int32 :int64 :int8 :uint8])

;;; Creation

(deftest zeros-ones-and-empty-default-to-float32-on-cpu-0
  (doseq [[f v] [[ndarray/zeros 0.0] [ndarray/ones 1.0] [ndarray/empty 0.0]]]
    (let [a (f [2 3])]
      (is (instance? NDArray a))
      (is (= [2 3] (ndarray/shape a)))
      (is (= DType/FLOAT32 (ndarray/dtype a)))
      (is (= "cpu(0)" (str (ndarray/context a))))
      (is (= (repeat 6 v) (ndarray/->vec a))))))

(deftest zeros-ones-and-empty-take-ctx-and-dtype
  (doseq [[f v] [[ndarray/zeros 0.0] [ndarray/ones 1.0] [ndarray/empty 0.0]]
          dt all-dtypes]
    (let [a (f [3 1] {:ctx (context/cpu 2) :dtype dt})]
      (is (= (name dt) (.mxnetName (ndarray/dtype a))))
      (is (= dt (ndarray/dtype-keyword (ndarray/dtype a))))
      (is (= "cpu(2)" (str (ndarray/context a))))
      (is (= [v v v] (ndarray/->vec a))))))

(deftest dtype-may-be-a-keyword-a-string-or-a-dtype
  (is (= DType/FLOAT64 (ndarray/dtype (ndarray/zeros [1] {:dtype :float64}))))
  (is (= DType/INT32 (ndarray/dtype (ndarray/zeros [1] {:dtype "int32"}))))
  (is (= DType/UINT8 (ndarray/dtype (ndarray/zeros [1] {:dtype DType/UINT8}))))
  (is (= DType/FLOAT32 (ndarray/dtype (ndarray/zeros [1] {:dtype nil}))))
  (is (= :invalid-argument (error-of #(ndarray/zeros [1] {:dtype :float128}))))
  (is (= :invalid-argument (error-of #(ndarray/->dtype 32)))))

(deftest full-fills-with-a-value
  (is (= [3.0 3.0] (ndarray/->vec (ndarray/full [1 2] 3))))
  (let [a (ndarray/full [2] 2.5 {:dtype :float64 :ctx (context/cpu 1)})]
    (is (= [2.5 2.5] (ndarray/->double-vec a)))
    (is (= DType/FLOAT64 (ndarray/dtype a)))
    (is (= "cpu(1)" (str (ndarray/context a)))))
  (is (= "Invalid value" (spec-message-of #(ndarray/full [1] "3")))))

(deftest array-copies-a-flat-vector-in-every-dtype
  (is (= [1.0 2.0 3.0 4.0 5.0 6.0] (ndarray/->vec (ndarray/array [1 2 3 4 5 6] [2 3]))))
  (is (= [2 3] (ndarray/shape (ndarray/array [1 2 3 4 5 6] [2 3]))))
  (doseq [dt all-dtypes]
    (let [a (ndarray/array [1 2 3] [3] {:dtype dt :ctx (context/cpu 1)})]
      (is (= dt (ndarray/dtype-keyword (ndarray/dtype a))))
      (is (= "cpu(1)" (str (ndarray/context a))))
      (is (= [1 2 3] (ndarray/->int-vec a)) (str dt))))
  (is (= [1.5 -2.25] (ndarray/->double-vec (ndarray/array [1.5 -2.25] [2] {:dtype :float64}))))
  (is (= [9007199254740993 -1] (ndarray/->long-vec (ndarray/array [9007199254740993 -1] [2] {:dtype :int64})))))

(deftest array-with-the-wrong-number-of-values-is-a-shape-mismatch
  (is (= :shape-mismatch (error-of #(ndarray/array [1 2 3] [2 2])))))

(deftest shapes-and-values-are-validated-with-spec
  (is (= "Invalid shape" (spec-message-of #(ndarray/zeros [2 -1]))))
  (is (= "Invalid shape" (spec-message-of #(ndarray/ones "2"))))
  (is (= "Invalid shape" (spec-message-of #(ndarray/zeros [1e10]))))
  (is (= "Invalid source vector" (spec-message-of #(ndarray/array [1 "2"] [2])))))

(deftest arange-gives-a-half-open-interval
  (is (= [0.0 1.0 2.0 3.0 4.0] (ndarray/->vec (ndarray/arange 0 5))))
  (is (= [1.0 1.5 2.0 2.5] (ndarray/->vec (ndarray/arange 1 3 {:step 0.5}))))
  (is (= [0.0 0.0 0.5 0.5 1.0 1.0 1.5 1.5 2.0 2.0 2.5 2.5 3.0 3.0 3.5 3.5 4.0 4.0 4.5 4.5]
         (ndarray/->vec (ndarray/arange 0 5 {:step 0.5 :repeat 2}))))
  (let [a (ndarray/arange 0 3 {:dtype :int32 :ctx (context/cpu 1)})]
    (is (= [0 1 2] (ndarray/->int-vec a)))
    (is (= DType/INT32 (ndarray/dtype a)))
    (is (= "cpu(1)" (str (ndarray/context a)))))
  (is (= "Invalid repeat" (spec-message-of #(ndarray/arange 0 3 {:repeat 0})))))

(deftest ->ndarray-builds-from-nested-vectors
  (let [a (ndarray/->ndarray [[1 2 3] [4 5 6]])]
    (is (= [2 3] (ndarray/shape a)))
    (is (= [1.0 2.0 3.0 4.0 5.0 6.0] (ndarray/->vec a))))
  (is (= [3 1 2] (ndarray/shape (ndarray/->ndarray [[[1 2]] [[3 4]] [[5 6]]]))))
  (is (= [5.0 -4.0] (ndarray/->vec (ndarray/->ndarray [5.0 -4.0]))))
  (let [a (ndarray/->ndarray [[1 2] [3 4]] {:ctx (context/cpu 1) :dtype :int64})]
    (is (= [1 2 3 4] (ndarray/->long-vec a)))
    (is (= DType/INT64 (ndarray/dtype a)))
    (is (= "cpu(1)" (str (ndarray/context a)))))
  (is (= :invalid-argument (error-of #(ndarray/->ndarray [[1 2] [3]]))))
  (is (= "Invalid N-D sequence" (spec-message-of #(ndarray/->ndarray [])))))

;;; Reading back

(deftest readers-convert-to-each-element-type
  (let [a (ndarray/array [1.5 -2.5 3] [3])]
    (is (= [1.5 -2.5 3.0] (ndarray/->vec a)))
    (is (every? #(instance? Float %) (ndarray/->vec a)))
    (is (= [1.5 -2.5 3.0] (ndarray/->float-vec a)))
    (is (every? #(instance? Float %) (ndarray/->float-vec a)))
    (is (= [1.5 -2.5 3.0] (ndarray/->double-vec a)))
    (is (every? #(instance? Double %) (ndarray/->double-vec a)))
    (is (= [1 -2 3] (ndarray/->int-vec a)))
    (is (every? #(instance? Integer %) (ndarray/->int-vec a)))
    (is (= [1 -2 3] (ndarray/->long-vec a)))
    (is (= [1.5 -2.5 3.0] (vec (ndarray/to-array a))))
    (is (instance? (Class/forName "[F") (ndarray/to-array a)))))

(deftest ->nd-vec-nests-by-shape
  (is (= [[1.0 2.0] [3.0 4.0] [5.0 6.0]] (ndarray/->nd-vec (ndarray/array [1 2 3 4 5 6] [3 2]))))
  (is (= [[[1.0]] [[2.0]] [[3.0]]] (ndarray/->nd-vec (ndarray/array [1 2 3] [3 1 1]))))
  (is (= [1.0 2.0] (ndarray/->nd-vec (ndarray/array [1 2] [2])))))

(deftest metadata
  (let [a (ndarray/zeros [4 1 2] {:ctx (context/cpu 1) :dtype :int8})]
    (is (= [4 1 2] (ndarray/shape a)))
    (is (= [4 1 2] (ndarray/shape-vec a)))
    (is (= 3 (ndarray/ndim a)))
    (is (= 8 (ndarray/size a)))
    (is (= DType/INT8 (ndarray/dtype a)))
    (is (= :int8 (ndarray/dtype-keyword (ndarray/dtype a))))
    (is (= "cpu" (context/device-type (ndarray/context a))))
    (is (= 1 (context/device-id (ndarray/context a))))))

;;; Arithmetic

(deftest arithmetic-with-a-number-makes-a-new-array
  (let [ones (ndarray/ones [2 1])]
    (is (= [3.0 3.0] (ndarray/->vec (ndarray/+ ones 2))))
    (is (= [-1.0 -1.0] (ndarray/->vec (ndarray/- ones 2))))
    (is (= [4.0 4.0] (ndarray/->vec (ndarray/* ones 4))))
    (is (= [0.5 0.5] (ndarray/->vec (ndarray/div ones 2))))
    (is (= [0.25 0.25] (ndarray/->vec (ndarray// ones 4.0))))
    (is (= [1.0 1.0] (ndarray/->vec ones)) "the operand is unchanged")))

(deftest arithmetic-with-an-array-makes-a-new-array
  (let [a (ndarray/array [1 2] [2 1])
        b (ndarray/array [4 8] [2 1])]
    (is (= [5.0 10.0] (ndarray/->vec (ndarray/+ a b))))
    (is (= [-3.0 -6.0] (ndarray/->vec (ndarray/- a b))))
    (is (= [4.0 16.0] (ndarray/->vec (ndarray/* a b))))
    (is (= [0.25 0.25] (ndarray/->vec (ndarray/div a b))))
    (is (= [4.0 4.0] (ndarray/->vec (ndarray// b a))))
    (is (= [1.0 2.0] (ndarray/->vec a)))
    (is (= [4.0 8.0] (ndarray/->vec b)))))

(deftest in-place-arithmetic-returns-the-array
  (let [a (ndarray/ones [2])]
    (is (identical? a (ndarray/+= a 1)))
    (is (= [2.0 2.0] (ndarray/->vec a)))
    (is (identical? a (ndarray/*= a (ndarray/full [2] 3))))
    (is (= [6.0 6.0] (ndarray/->vec a)))
    (is (identical? a (ndarray/-= a (ndarray/ones [2]))))
    (is (= [5.0 5.0] (ndarray/->vec a)))
    (is (identical? a (ndarray/div= a 2)))
    (is (= [2.5 2.5] (ndarray/->vec a)))))

(deftest arithmetic-errors
  (is (= :shape-mismatch (error-of #(ndarray/+ (ndarray/ones [2]) (ndarray/ones [3])))))
  (is (= :shape-mismatch (error-of #(ndarray/+= (ndarray/ones [2]) (ndarray/ones [2 2])))))
  (is (= "Invalid operand" (spec-message-of #(ndarray/* (ndarray/ones [2]) "2"))))
  (is (= "Invalid ndarray" (spec-message-of #(ndarray/+ 1 (ndarray/ones [2]))))))

;;; Copies

(deftest copy-makes-an-independent-array
  (let [a (ndarray/array [1 2] [2])
        b (ndarray/copy a)]
    (ndarray/+= a 1)
    (is (= [1.0 2.0] (ndarray/->vec b)))
    (is (= [2.0 3.0] (ndarray/->vec a)))))

(deftest copy-to-an-array-fills-it-and-returns-it
  (let [source (ndarray/array [1 2 3] [1 3])
        dest (ndarray/zeros [1 3] {:dtype :float64})]
    (is (identical? dest (ndarray/copy-to source dest)))
    (is (= [1 3] (ndarray/shape dest)))
    (is (= DType/FLOAT64 (ndarray/dtype dest)) "the target keeps its dtype")
    (is (= [1.0 2.0 3.0] (ndarray/->double-vec dest)))
    (is (= :shape-mismatch (error-of #(ndarray/copy-to source (ndarray/zeros [3 1])))))))

(deftest copy-to-a-context-makes-a-new-array-there
  (let [source (ndarray/array [1 2 3] [3])
        c (ndarray/copy-to source (context/cpu 2))]
    (is (not (identical? source c)))
    (is (= "cpu(2)" (str (ndarray/context c))))
    (is (= [1.0 2.0 3.0] (ndarray/->vec c)))))

(deftest as-in-context-copies-only-when-needed
  (let [a (ndarray/ones [2])]
    (is (identical? a (ndarray/as-in-context a (context/cpu 0))))
    (let [b (ndarray/as-in-context a (context/cpu 1))]
      (is (not (identical? a b)))
      (is (= "cpu(1)" (str (ndarray/context b))))
      (is (= [1.0 1.0] (ndarray/->vec b))))))

(deftest as-type-converts
  (let [a (ndarray/array [1.7 -2.7] [2])
        b (ndarray/as-type a :int32)]
    (is (= DType/INT32 (ndarray/dtype b)))
    (is (= [1 -2] (ndarray/->int-vec b)) "float to int truncates toward zero")
    (is (= DType/FLOAT32 (ndarray/dtype a)))
    (is (= DType/FLOAT64 (ndarray/dtype (ndarray/as-type a DType/FLOAT64))))))

(deftest set-fills-from-a-number-or-a-vector
  (let [a (ndarray/zeros [2 2])]
    (is (identical? a (ndarray/set a 10)))
    (is (= [10.0 10.0 10.0 10.0] (ndarray/->vec a)))
    (ndarray/set a [1 2 3 4])
    (is (= [1.0 2.0 3.0 4.0] (ndarray/->vec a)))
    (is (= :shape-mismatch (error-of #(ndarray/set a [1 2 3]))))))

(deftest a-disposed-array-cannot-be-used
  (let [a (ndarray/ones [2])]
    (is (nil? (ndarray/dispose a)))
    (is (nil? (ndarray/dispose a)) "dispose is idempotent")
    (is (= :disposed (error-of #(ndarray/->vec a))))
    (is (= :disposed (error-of #(ndarray/+ a 1))))
    (is (re-find #"^#object\[io.github.kvstore.NDArray " (pr-str a))
        "printing a disposed array does not throw")))

(deftest a-gpu-array-works-or-is-device-unavailable
  (let [r (try (ndarray/ones [2] {:ctx (context/gpu 0)})
               (catch clojure.lang.ExceptionInfo e (ex-data e)))]
    (if (instance? NDArray r)
      (is (= [1.0 1.0] (ndarray/->vec r)))
      (is (= :device-unavailable (:kvstore/error r))))))

;;; Printing

(deftest arrays-print-with-values-shape-dtype-and-context
  (let [a (ndarray/array [1 2 3 4 5 6] [2 3] {:ctx (context/cpu 1)})]
    (is (= "#kvstore/ndarray {:shape [2 3], :dtype :float32, :ctx \"cpu(1)\", :values [[1.0 2.0 3.0] [4.0 5.0 6.0]]}"
           (pr-str a)))
    (is (= "#kvstore/ndarray {:shape [2], :dtype :int32, :ctx \"cpu(0)\", :values [7 -8]}"
           (pr-str (ndarray/array [7 -8] [2] {:dtype :int32}))))))

(deftest printed-arrays-read-back
  (doseq [a [(ndarray/array [1 2 3 4 5 6] [2 3] {:ctx (context/cpu 1)})
             (ndarray/array [0.1 -2.5] [2 1] {:dtype :float64})
             (ndarray/array [1 2 3] [3] {:dtype :uint8})]]
    (let [b (edn/read-string {:readers {'kvstore/ndarray ndarray/read-ndarray}} (pr-str a))]
      (is (= (ndarray/shape a) (ndarray/shape b)))
      (is (= (ndarray/dtype a) (ndarray/dtype b)))
      (is (= (str (ndarray/context a)) (str (ndarray/context b))))
      (is (= (ndarray/->double-vec a) (ndarray/->double-vec b)))))
  (testing "the tag reads back with the default data readers (data_readers.clj)"
    (let [b (read-string "#kvstore/ndarray {:shape [2], :dtype :int32, :ctx \"cpu(1)\", :values [7 -8]}")]
      (is (instance? NDArray b))
      (is (= [7 -8] (ndarray/->long-vec b)))
      (is (= DType/INT32 (ndarray/dtype b)))
      (is (= "cpu(1)" (str (ndarray/context b))))))
  (testing "print-dup gives a form that evaluates to an equal array"
    (let [a (ndarray/array [0.1 2 3] [3] {:ctx (context/cpu 1)})
          s (binding [*print-dup* true] (pr-str a))
          b (binding [*read-eval* true] (read-string s))]
      (is (instance? NDArray b))
      (is (= (ndarray/->vec a) (ndarray/->vec b)))
      (is (= "cpu(1)" (str (ndarray/context b)))))))

(deftest large-arrays-print-a-bounded-summary
  (let [a (ndarray/zeros [2000000])
        s (pr-str a)]
    (is (< (count s) 1000) "the printed form does not grow with the array")
    (is (re-find #"^#kvstore/ndarray \{:shape \[2000000\], :dtype :float32, :ctx \"cpu\(0\)\", :summary \"" s) s)
    (is (not (re-find #":values" s)))
    (testing "reading a summary back is an invalid-argument error, not a wrong array"
      (let [e (try (edn/read-string {:readers {'kvstore/ndarray ndarray/read-ndarray}} s) nil
                   (catch Exception e e))
            info (loop [t e] (cond (nil? t) nil
                                   (instance? clojure.lang.ExceptionInfo t) t
                                   :else (recur (.getCause ^Throwable t))))]
        (is (= :invalid-argument (:kvstore/error (ex-data info))) (str e))
        (is (re-find #"summary" (str (ex-message info))))))
    (testing "*print-threshold* decides"
      (let [b (ndarray/array (range 1001) [1001])]
        (is (re-find #":summary" (pr-str b)))
        (is (re-find #":values" (binding [ndarray/*print-threshold* 1001] (pr-str b))))
        (is (re-find #":values" (pr-str (ndarray/array (range 1000) [1000]))))))))

(deftest print-length-and-print-level-do-not-cut-the-printed-array
  (let [a (ndarray/array [1 2 3 4 5 6] [2 3] {:dtype :int32})
        s (binding [*print-length* 2 *print-level* 1] (pr-str a))]
    (is (= "#kvstore/ndarray {:shape [2 3], :dtype :int32, :ctx \"cpu(0)\", :values [[1 2 3] [4 5 6]]}" s))
    (is (= [1 2 3 4 5 6] (ndarray/->long-vec (edn/read-string {:readers {'kvstore/ndarray ndarray/read-ndarray}} s))))
    (testing "they still apply around the array"
      (is (= "[1 2 ...]" (binding [*print-length* 2] (pr-str [1 2 a])))))))

(deftest a-nil-or-non-array-argument-is-invalid-argument
  (doseq [[op f] {:shape ndarray/shape :ndim ndarray/ndim :size ndarray/size :dtype ndarray/dtype
                  :context ndarray/context :->vec ndarray/->vec :->double-vec ndarray/->double-vec
                  :->int-vec ndarray/->int-vec :->long-vec ndarray/->long-vec :copy ndarray/copy
                  :dispose ndarray/dispose :as-type #(ndarray/as-type % :int32)
                  :as-in-context #(ndarray/as-in-context % (context/cpu)) :+ #(ndarray/+ % 1)}
          x [nil "array"]]
    (let [e (try (f x) nil (catch Exception e e))]
      (is (instance? clojure.lang.ExceptionInfo e) (str op " of " (pr-str x) ": " e))
      (is (= :invalid-argument (:kvstore/error (ex-data e))) (str op)))))

;;; Properties

(def ^:private gen-small-int (gen/choose -1000 1000))

(defspec array-then-->vec-round-trips 50
  (prop/for-all [xs (gen/not-empty (gen/vector gen-small-int))]
    (= (map double xs)
       (ndarray/->vec (ndarray/array xs [(count xs)])))))

(defspec ->ndarray-then-->nd-vec-round-trips 50
  (prop/for-all [[rows cols xs] (gen/let [rows (gen/choose 1 5)
                                           cols (gen/choose 1 5)
                                           xs (gen/vector gen-small-int (* rows cols))]
                                   [rows cols xs])]
    (let [nd (mapv vec (partition cols xs))
          a (ndarray/->ndarray nd {:dtype :int32})]
      (and (= [rows cols] (ndarray/shape a))
           (= nd (mapv #(mapv long %) (ndarray/->nd-vec a)))))))

(defspec element-wise-arithmetic-matches-clojure 50
  (prop/for-all [pairs (gen/not-empty (gen/vector (gen/tuple gen-small-int gen-small-int)))
                 k gen-small-int]
    (let [n (count pairs)
          a (ndarray/array (map first pairs) [n] {:dtype :float64})
          b (ndarray/array (map second pairs) [n] {:dtype :float64})]
      (and (= (map #(double (+ (first %) (second %))) pairs) (ndarray/->double-vec (ndarray/+ a b)))
           (= (map #(double (- (first %) (second %))) pairs) (ndarray/->double-vec (ndarray/- a b)))
           (= (map #(double (* (first %) (second %))) pairs) (ndarray/->double-vec (ndarray/* a b)))
           (= (map #(double (* (first %) k)) pairs) (ndarray/->double-vec (ndarray/* a k)))))))
