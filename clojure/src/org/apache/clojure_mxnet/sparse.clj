(ns org.apache.clojure-mxnet.sparse
  "Row-sparse arrays (MXNet's `row_sparse` storage), over
  `io.github.kvstore.RowSparse`: a logical shape `[rows ...]` of which only
  the rows `indices` are stored, as one dense NDArray `data` of shape
  `[(count indices) ...]`; every other row is zero. An addition to
  clojure-mxnet, which has no sparse arrays.

      (def g (sparse/row-sparse-array (ndarray/ones [2 8]) [3 7] [1000 8]))
      (kvstore/init kv \"emb\" (sparse/zeros [1000 8]))
      (kvstore/push kv \"emb\" g)                       ; only rows 3 and 7
      (kvstore/row-sparse-pull kv \"emb\" [7 3 7])      ; rows 3 and 7

  `kvstore/init` and `kvstore/push` take row-sparse values in the forms they
  take NDArrays (every value of a call row-sparse); `kvstore/row-sparse-pull`
  returns the rows asked for. A row-sparse array owns its data: `close`
  closes it."
  (:refer-clojure :exclude [zeros])
  (:require [clojure.spec.alpha :as s]
            [org.apache.clojure-mxnet.ndarray :as ndarray]
            [org.apache.clojure-mxnet.util :as util])
  (:import (io.github.kvstore NDArray RowSparse)))

(set! *warn-on-reflection* true)

(s/def ::dim (s/and nat-int? #(<= % Integer/MAX_VALUE)))
(s/def ::shape-vec (s/coll-of ::dim :kind sequential? :min-count 1))
(s/def ::indices (s/coll-of util/long-value? :kind sequential?))
(s/def ::ndarray #(instance? NDArray %))
(s/def ::row-sparse #(instance? RowSparse %))

(defn row-sparse?
  "Whether `x` is a row-sparse array."
  [x]
  (instance? RowSparse x))

(defn- ->shape ^ints [shape-vec]
  (util/validate! ::shape-vec shape-vec "Invalid shape")
  (int-array shape-vec))

(defn- validate-row-sparse! [x]
  (when-not (row-sparse? x)
    (util/validate! ::row-sparse x "Invalid row-sparse array")))

(defn row-sparse-array
  "The row-sparse array of shape `shape-vec` whose rows `indices` (strictly
  increasing, each below `(first shape-vec)`) are the NDArray `data` (of shape
  `[(count indices) ...]`, used without a copy: the array owns it from now
  on). An index that does not fit a long (a BigInt beyond it) is \"Invalid
  indices\", `{:kvstore/error :invalid-argument}`, never wrapped."
  [data indices shape-vec]
  (util/validate! ::ndarray data "Invalid data")
  (util/validate! ::indices indices "Invalid indices")
  (let [shape (->shape shape-vec)]
    (util/with-kvstore-errors :row-sparse-array
      (RowSparse/of ^NDArray data (long-array indices) shape))))

(defn zeros
  "A row-sparse array of shape `shape-vec` with no rows stored; `:dtype` as in
  `ndarray` (default float32)."
  ([shape-vec {:keys [dtype]}]
   (let [shape (->shape shape-vec)]
     (util/with-kvstore-errors :zeros
       (RowSparse/zeros shape (ndarray/->dtype dtype)))))
  ([shape-vec]
   (zeros shape-vec {})))

(defn from-dense
  "The rows of the NDArray `nd` that hold a non-zero element, as a row-sparse
  array (MXNet's `tostype('row_sparse')`); the data is a copy."
  [nd]
  (util/validate! ::ndarray nd "Invalid ndarray")
  (util/with-kvstore-errors :from-dense
    (RowSparse/fromDense ^NDArray nd)))

(defn to-dense
  "The whole array `rsp` as a new NDArray, zero in the rows not stored."
  [rsp]
  (validate-row-sparse! rsp)
  (util/with-kvstore-errors :to-dense
    (.toDense ^RowSparse rsp)))

(defn data
  "The stored rows of `rsp`: its data NDArray (not a copy)."
  [rsp]
  (validate-row-sparse! rsp)
  (.data ^RowSparse rsp))

(defn indices
  "The row numbers of `rsp`'s stored rows, a vector."
  [rsp]
  (validate-row-sparse! rsp)
  (vec (.indices ^RowSparse rsp)))

(defn shape
  "The whole shape of `rsp`, a vector."
  [rsp]
  (validate-row-sparse! rsp)
  (mapv long (.shape ^RowSparse rsp)))

(defn close
  "Closes `rsp`'s data array. Returns nil."
  [rsp]
  (validate-row-sparse! rsp)
  (.close ^RowSparse rsp))
