(ns org.apache.clojure-mxnet.ndarray
  "The arrays a KVStore stores, as in clojure-mxnet's
  `org.apache.clojure-mxnet.ndarray`, over `io.github.kvstore.NDArray`.

  Only what users of a KVStore need: creation (`zeros ones full empty array
  arange ->ndarray`), reading back (`->vec ->float-vec ->double-vec ->int-vec
  ->long-vec ->nd-vec to-array`), element-wise `+ - * /` with a number or an
  array (new arrays) and `+= -= *= div=` (in place, returning the array),
  copies (`copy copy-to as-in-context as-type set`) and metadata (`shape
  shape-vec ndim size dtype context`).

  Options maps take `:ctx` (a context; default `(context/default-context)`) and
  `:dtype` (default float32), given as a keyword (`:float32 :float64 :float16
  :bfloat16 :int32 :int64 :int8 :uint8`), a string (\"float32\") or an
  `io.github.kvstore.DType`.

  Differences from clojure-mxnet: `shape` returns a vector (there is no Shape
  class); `empty` returns zeros; `full`, `array` and `->ndarray` honour
  `:dtype`. Arrays print as `#kvstore/ndarray {:shape [2 3] :dtype :float32
  :ctx \"cpu(0)\" :values [[...] [...]]}`, which reads back: `read-ndarray` is
  the tag's reader, registered by the jar's data_readers.clj (the tag reads
  once this namespace is loaded); with `*print-dup*` they print as a
  `#=(...)` form. Arrays of more than `*print-threshold*` (1000) elements
  print a `:summary` string instead of `:values` (reading that back is an
  error); `*print-length*` and `*print-level*` do not cut the printed map.

  Errors are `ex-info`: bad arguments carry spec's explain-data, errors from
  the native side `{:kvstore/error <keyword> ...}` (see
  `org.apache.clojure-mxnet.util`)."
  (:refer-clojure :exclude [* - + / empty set to-array])
  (:require [clojure.spec.alpha :as s]
            [org.apache.clojure-mxnet.context :as mx-context]
            [org.apache.clojure-mxnet.util :as util])
  (:import (io.github.kvstore Context DType KVStoreException NDArray)
           (java.io Writer)))

(set! *warn-on-reflection* true)

;;; Coercions

(def ^:private dtypes-by-name
  (into {} (map (fn [^DType d] [(.mxnetName d) d])) (DType/values)))

(defn ->dtype
  "Coerces `x` to a `DType`: a DType as is, nil is float32, a keyword, symbol
  or string is looked up by MXNet name (`:float32`, \"int64\", ...)."
  ^DType [x]
  (cond
    (instance? DType x) x
    (nil? x) DType/FLOAT32
    (or (keyword? x) (string? x) (symbol? x))
    (or (get dtypes-by-name (name x))
        (util/invalid-argument! (str "Invalid dtype: " (pr-str x)
                                     "; known: " (sort (keys dtypes-by-name)))
                                {:kvstore/op :dtype :dtype x}))
    :else (util/invalid-argument! (str "Invalid dtype: " (pr-str x))
                                  {:kvstore/op :dtype :dtype x})))

(defn dtype-keyword
  "The keyword naming `dtype` (a DType, keyword or string): `:float32`."
  [dtype]
  (keyword (.mxnetName (->dtype dtype))))

(s/def ::dim (s/and nat-int? #(<= % Integer/MAX_VALUE)))
(s/def ::shape-vec (s/coll-of ::dim :kind sequential?))
(s/def ::ndarray #(instance? NDArray %))
(s/def ::num-or-ndarray (s/or :number number? :ndarray ::ndarray))
(s/def ::number number?)
(s/def ::numbers (s/coll-of number? :kind sequential?))

(defn- ->shape
  ^ints [shape-vec]
  (util/validate! ::shape-vec shape-vec "Invalid shape")
  (int-array shape-vec))

(defn- validate-ndarray! [x]
  (when-not (instance? NDArray x)
    (util/validate! ::ndarray x "Invalid ndarray")))

;;; Metadata

(defn shape
  "The shape of `ndarray` as a vector: `[2 3]`. (clojure-mxnet returns a Shape.)"
  [^NDArray ndarray]
  (validate-ndarray! ndarray)
  (util/with-kvstore-errors :shape
    (mapv long (.shape ndarray))))

(defn shape-vec
  "The shape of `ndarray` as a vector: `[2 3]`."
  [ndarray]
  (shape ndarray))

(defn ndim
  "The number of dimensions of `ndarray`."
  [^NDArray ndarray]
  (validate-ndarray! ndarray)
  (util/with-kvstore-errors :ndim
    (.ndim ndarray)))

(defn size
  "The number of elements of `ndarray`."
  [^NDArray ndarray]
  (validate-ndarray! ndarray)
  (util/with-kvstore-errors :size
    (.size ndarray)))

(defn dtype
  "The element type of `ndarray`, an `io.github.kvstore.DType` (see
  `dtype-keyword`)."
  ^DType [^NDArray ndarray]
  (validate-ndarray! ndarray)
  (util/with-kvstore-errors :dtype
    (.dtype ndarray)))

(defn context
  "The context (device) `ndarray` lives in."
  ^Context [^NDArray ndarray]
  (validate-ndarray! ndarray)
  (util/with-kvstore-errors :context
    (.context ndarray)))

;;; Creation

(defn zeros
  "A new NDArray filled with 0, with shape `shape-vec`."
  ([shape-vec {:keys [ctx dtype]}]
   (let [shape (->shape shape-vec)
         ctx (mx-context/->context ctx)
         dtype (->dtype dtype)]
     (util/with-kvstore-errors :zeros
       (NDArray/zeros shape ctx dtype))))
  ([shape-vec]
   (zeros shape-vec {})))

(defn empty
  "A new NDArray with shape `shape-vec`. Its elements are 0 (clojure-mxnet's
  are uninitialised)."
  ([shape-vec opts]
   (zeros shape-vec opts))
  ([shape-vec]
   (empty shape-vec {})))

(defn ones
  "A new NDArray filled with 1, with shape `shape-vec`."
  ([shape-vec {:keys [ctx dtype]}]
   (let [shape (->shape shape-vec)
         ctx (mx-context/->context ctx)
         dtype (->dtype dtype)]
     (util/with-kvstore-errors :ones
       (NDArray/ones shape ctx dtype))))
  ([shape-vec]
   (ones shape-vec {})))

(defn full
  "A new NDArray filled with `value`, with shape `shape-vec`."
  ([shape-vec value {:keys [ctx dtype]}]
   (util/validate! ::number value "Invalid value")
   (let [shape (->shape shape-vec)
         ctx (mx-context/->context ctx)
         dtype (->dtype dtype)]
     (util/with-kvstore-errors :full
       (NDArray/full shape (double value) ctx dtype))))
  ([shape-vec value]
   (full shape-vec value {})))

(defn array
  "A new NDArray with shape `shape-vec` holding the numbers of the flat
  sequence `source-vec` (row-major). The data cross to the native side as the
  primitive type of the dtype when there is one (float32, float64, int32,
  int64), as doubles otherwise."
  ([source-vec shape-vec {:keys [ctx dtype]}]
   (when-not (and (sequential? source-vec) (every? number? source-vec))
     (util/validate! ::numbers source-vec "Invalid source vector"))
   (let [shape (->shape shape-vec)
         ctx (mx-context/->context ctx)
         dtype (->dtype dtype)]
     (util/with-kvstore-errors :array
       (condp = dtype
         DType/FLOAT32 (NDArray/array (float-array source-vec) shape ctx dtype)
         DType/INT32 (NDArray/array (int-array source-vec) shape ctx dtype)
         DType/INT64 (NDArray/array (long-array source-vec) shape ctx dtype)
         (NDArray/array (double-array source-vec) shape ctx dtype)))))
  ([source-vec shape-vec]
   (array source-vec shape-vec {})))

(defn- repeat-each
  "A new NDArray of `values` (a double[]) with each element repeated `n`
  times. The size is checked before anything is allocated: more elements than
  an array can have is `:invalid-argument`, more than the Java heap can hold
  `:resource-exhausted`."
  [^doubles values n ctx dtype]
  (let [len (alength values)
        total (*' n len)]
    (when (> total Integer/MAX_VALUE)
      (util/invalid-argument! (str "arange: " len " values repeated " n " times are " total
                                   " elements, more than an array can have (" Integer/MAX_VALUE ")")
                              {:kvstore/op :arange :size total}))
    (util/check-heap! :arange (clojure.core/* 8 total) (str total " elements"))
    (util/with-kvstore-errors :arange
      (let [^doubles data (double-array total)]
        (dotimes [i len]
          (java.util.Arrays/fill data (int (clojure.core/* i n)) (int (clojure.core/* (inc i) n)) (aget values i)))
        (NDArray/array data (int-array [total]) ^Context ctx ^DType dtype)))))

(defn arange
  "A 1-D NDArray of evenly spaced values in the half-open interval
  [`start`, `stop`), `:step` apart (default 1), each repeated `:repeat` times
  (default 1). More elements than an array can have (2^31 - 1) is
  `{:kvstore/error :invalid-argument}`; more than the Java heap can hold while
  the values are built is `{:kvstore/error :resource-exhausted}`."
  ([start stop {:keys [step repeat ctx dtype] :or {step 1 repeat 1}}]
   (util/validate! ::number start "Invalid start")
   (util/validate! ::number stop "Invalid stop")
   (util/validate! ::number step "Invalid step")
   (util/validate! pos-int? repeat "Invalid repeat")
   (let [ctx (mx-context/->context ctx)
         dtype (->dtype dtype)
         a (util/with-kvstore-errors :arange
             (NDArray/arange (double start) (double stop) (double step) ctx dtype))]
     (if (= 1 repeat)
       a
       (let [^NDArray a a
             values (try
                      (util/with-kvstore-errors :arange (.toDoubleArray a))
                      (finally (.close a)))]
         (repeat-each values repeat ctx dtype)))))
  ([start stop]
   (arange start stop {})))

(defn ->ndarray
  "A new NDArray with the values and the shape of the nested vector `nd-vec`:
  `(->ndarray [[1 2 3] [4 5 6]])` has shape [2 3]. Options: `:ctx`, `:dtype`."
  ([nd-vec opts]
   (array (vec (flatten nd-vec))
          (util/nd-seq-shape nd-vec)
          opts))
  ([nd-vec]
   (->ndarray nd-vec {})))

;;; Reading back

(defn to-array
  "The elements of `ndarray` as a new float[] (converted from its dtype)."
  ^floats [^NDArray ndarray]
  (validate-ndarray! ndarray)
  (util/with-kvstore-errors :to-array
    (.toFloatArray ndarray)))

(defn ->vec
  "The elements of `ndarray` as a flat vector of Floats (as clojure-mxnet):
  `[2.0 2.0 2.0]`."
  [ndarray]
  (vec (to-array ndarray)))

(defn ->float-vec
  "The elements of `ndarray` as a flat vector of Floats."
  [ndarray]
  (->vec ndarray))

(defn ->double-vec
  "The elements of `ndarray` as a flat vector of Doubles."
  [^NDArray ndarray]
  (validate-ndarray! ndarray)
  (util/with-kvstore-errors :->double-vec
    (vec (.toDoubleArray ndarray))))

(defn ->int-vec
  "The elements of `ndarray` as a flat vector of Integers (floats are
  truncated toward zero)."
  [^NDArray ndarray]
  (validate-ndarray! ndarray)
  (util/with-kvstore-errors :->int-vec
    (vec (.toIntArray ndarray))))

(defn ->long-vec
  "The elements of `ndarray` as a flat vector of Longs."
  [^NDArray ndarray]
  (validate-ndarray! ndarray)
  (util/with-kvstore-errors :->long-vec
    (vec (.toLongArray ndarray))))

(defn- nest
  "Cuts the flat vector `v` into nested vectors of shape `shape`."
  [v [d & ds]]
  (if (seq ds)
    (let [row (reduce clojure.core/* 1 ds)]
      (mapv #(nest (into [] (subvec v (clojure.core/* % row) (clojure.core/* (inc %) row))) ds)
            (range d)))
    (vec v)))

(defn ->nd-vec
  "The elements of `ndarray` as nested vectors of its shape:
  `(->nd-vec (array [1 2 3 4 5 6] [3 2]))` is `[[1.0 2.0] [3.0 4.0] [5.0 6.0]]`."
  [ndarray]
  (validate-ndarray! ndarray)
  (let [shape (shape ndarray)]
    (if (empty? shape)
      (->vec ndarray)
      (nest (->vec ndarray) shape))))

;;; Arithmetic

(defn- binary [op ^NDArray ndarray num-or-ndarray]
  (validate-ndarray! ndarray)
  (when-not (or (number? num-or-ndarray) (instance? NDArray num-or-ndarray))
    (util/validate! ::num-or-ndarray num-or-ndarray "Invalid operand"))
  (util/with-kvstore-errors op
    (if (instance? NDArray num-or-ndarray)
      (let [other ^NDArray num-or-ndarray]
        (case op
          :+ (.add ndarray other)
          :- (.sub ndarray other)
          :* (.mul ndarray other)
          :div (.div ndarray other)
          :+= (.addInPlace ndarray other)
          :-= (.subInPlace ndarray other)
          :*= (.mulInPlace ndarray other)
          :div= (.divInPlace ndarray other)))
      (let [x (double num-or-ndarray)]
        (case op
          :+ (.add ndarray x)
          :- (.sub ndarray x)
          :* (.mul ndarray x)
          :div (.div ndarray x)
          :+= (.addInPlace ndarray x)
          :-= (.subInPlace ndarray x)
          :*= (.mulInPlace ndarray x)
          :div= (.divInPlace ndarray x))))))

(defn +
  "A new NDArray: `ndarray` + `num-or-ndarray`, element-wise."
  [ndarray num-or-ndarray]
  (binary :+ ndarray num-or-ndarray))

(defn -
  "A new NDArray: `ndarray` - `num-or-ndarray`, element-wise."
  [ndarray num-or-ndarray]
  (binary :- ndarray num-or-ndarray))

(defn *
  "A new NDArray: `ndarray` * `num-or-ndarray`, element-wise."
  [ndarray num-or-ndarray]
  (binary :* ndarray num-or-ndarray))

(defn div
  "A new NDArray: `ndarray` / `num-or-ndarray`, element-wise."
  [ndarray num-or-ndarray]
  (binary :div ndarray num-or-ndarray))

(defn /
  "A new NDArray: `ndarray` / `num-or-ndarray`, element-wise."
  [ndarray num-or-ndarray]
  (div ndarray num-or-ndarray))

(defn +=
  "Adds `num-or-ndarray` to `ndarray` in place; returns `ndarray`.
  In an updater: `(fn [key input stored] (ndarray/+= stored input))`."
  [ndarray num-or-ndarray]
  (binary :+= ndarray num-or-ndarray))

(defn -=
  "Subtracts `num-or-ndarray` from `ndarray` in place; returns `ndarray`."
  [ndarray num-or-ndarray]
  (binary :-= ndarray num-or-ndarray))

(defn *=
  "Multiplies `ndarray` by `num-or-ndarray` in place; returns `ndarray`."
  [ndarray num-or-ndarray]
  (binary :*= ndarray num-or-ndarray))

(defn div=
  "Divides `ndarray` by `num-or-ndarray` in place; returns `ndarray`."
  [ndarray num-or-ndarray]
  (binary :div= ndarray num-or-ndarray))

;;; Copies

(defn copy
  "A new NDArray with the contents of `ndarray`, in the same context."
  [^NDArray ndarray]
  (validate-ndarray! ndarray)
  (util/with-kvstore-errors :copy
    (.copyTo ndarray (.context ndarray))))

(defn copy-to
  "Copies `source-ndarray` into `target`: when `target` is an NDArray (same
  shape; the dtype is converted), its contents are replaced and it is
  returned; when it is a context, a new NDArray in that context is returned."
  [^NDArray source-ndarray target]
  (validate-ndarray! source-ndarray)
  (util/with-kvstore-errors :copy-to
    (if (instance? NDArray target)
      (.copyFrom ^NDArray target source-ndarray)
      (.copyTo source-ndarray (mx-context/->context target)))))

(defn as-in-context
  "`ndarray` itself when it lives in `ctx`, else a copy in `ctx`."
  [^NDArray ndarray ctx]
  (validate-ndarray! ndarray)
  (let [ctx (mx-context/->context ctx)]
    (util/with-kvstore-errors :as-in-context
      (if (= (str ctx) (str (.context ndarray)))
        ndarray
        (.copyTo ndarray ctx)))))

(defn as-type
  "A new NDArray with the values of `ndarray` converted to `dtype`."
  [^NDArray ndarray dtype]
  (validate-ndarray! ndarray)
  (let [dtype (->dtype dtype)]
    (util/with-kvstore-errors :as-type
      (.asType ndarray dtype))))

(defn set
  "Sets every element of `ndarray` to the number `value`, or to the flat
  sequence of numbers `value`; returns `ndarray`."
  [^NDArray ndarray value]
  (validate-ndarray! ndarray)
  (util/validate! (s/or :number number? :numbers ::numbers) value "Invalid value")
  (let [src (if (number? value)
              (full (shape ndarray) value {:ctx (context ndarray) :dtype (dtype ndarray)})
              (array value (shape ndarray) {:ctx (context ndarray) :dtype (dtype ndarray)}))]
    (try
      (util/with-kvstore-errors :set
        (.copyFrom ndarray ^NDArray src))
      (finally (.close ^NDArray src)))))

(defn dispose
  "Frees the native memory of `ndarray` now (it is also freed once
  unreachable). Idempotent. Later use is `{:kvstore/error :disposed}`."
  [^NDArray ndarray]
  (validate-ndarray! ndarray)
  (util/with-kvstore-errors :dispose
    (.close ndarray))
  nil)

;;; Printing and reading

(defn- values-of
  "The values of `ndarray` nested in its shape, as the numbers that print and
  read back exactly: Longs for integer dtypes, Doubles for float64 (and for
  every float dtype when `exact?`), else Floats (which print short)."
  [^NDArray ndarray exact?]
  (let [d (.dtype ndarray)
        v (condp = d
            DType/FLOAT64 (->double-vec ndarray)
            DType/INT32 (->long-vec ndarray)
            DType/INT64 (->long-vec ndarray)
            DType/INT8 (->long-vec ndarray)
            DType/UINT8 (->long-vec ndarray)
            (if exact? (->double-vec ndarray) (->vec ndarray)))
        shape (vec (.shape ndarray))]
    (if (empty? shape) v (nest v shape))))

(def ^:dynamic *print-threshold*
  "Arrays of more elements than this print as a summary (see `print-method`),
  not with every value: printing ten million values would take gigabytes. Bind
  it higher to print a larger array whole. Default 1000."
  1000)

(defn- printable-map
  "The map an NDArray prints as: its values when it has at most
  `*print-threshold*` elements (or `exact?`, for print-dup), else a `:summary`,
  the Java `toString` (its first and last values per axis)."
  [^NDArray ndarray exact?]
  (let [m {:shape (mapv long (.shape ndarray))
           :dtype (dtype-keyword (.dtype ndarray))
           :ctx (str (.context ndarray))}]
    (if (or exact? (<= (.size ndarray) *print-threshold*))
      (assoc m :values (values-of ndarray exact?))
      (assoc m :summary (str ndarray)))))

(defn read-ndarray
  "Builds an NDArray from the map an NDArray prints as (`:values` nested or
  flat, `:shape`, `:dtype`, `:ctx` as printed): the reader of the tag
  `#kvstore/ndarray`. The summary of a large array (a `:summary` and no
  `:values`) cannot be read back: it is `{:kvstore/error :invalid-argument}`."
  [{:keys [values shape dtype ctx] :as m}]
  (when-not (contains? m :values)
    (util/invalid-argument!
     (str "Cannot read an NDArray from a map without :values"
          (when (contains? m :summary)
            (str ": it was printed as a summary (more than *print-threshold* elements);"
                 " bind org.apache.clojure-mxnet.ndarray/*print-threshold* higher, or *print-dup*,"
                 " to print its values")))
     {:kvstore/op :read-ndarray :shape shape :dtype dtype :ctx ctx}))
  (let [flat (vec (flatten values))]
    (array flat (or shape (util/nd-seq-shape values)) {:ctx ctx :dtype dtype})))

(defn- print-ndarray [^NDArray ndarray ^Writer w dup?]
  ;; A disposed array still prints, as an opaque object.
  (let [m (if (.isClosed ndarray)
            "NDArray was used after it was closed"
            (try
              (printable-map ndarray dup?)
              (catch clojure.lang.ExceptionInfo e
                (ex-message e))
              (catch KVStoreException e
                (ex-message e))))]
    (if (map? m)
      (do
        (.write w (if dup?
                    "#=(org.apache.clojure-mxnet.ndarray/read-ndarray "
                    "#kvstore/ndarray "))
        ;; The map is one value: *print-length* / *print-level* cutting it (or its
        ;; values) would print a form that no longer reads back. Its size is
        ;; bounded by *print-threshold* instead.
        (binding [*print-length* nil
                  *print-level* nil]
          (print-method m w))
        (when dup? (.write w ")")))
      (.write w (str "#object[io.github.kvstore.NDArray " (pr-str (str m)) "]")))))

(defmethod print-method NDArray [ndarray ^Writer w]
  (print-ndarray ndarray w false))

(defmethod print-dup NDArray [ndarray ^Writer w]
  (print-ndarray ndarray w true))
