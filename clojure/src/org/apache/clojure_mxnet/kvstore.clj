(ns org.apache.clojure-mxnet.kvstore
  "The key-value store, as in clojure-mxnet's `org.apache.clojure-mxnet.kvstore`,
  over `io.github.kvstore.KVStore`.

  Same names, arities and argument forms as clojure-mxnet: keys are a string
  or a vector of strings, values and outs an NDArray or a vector of NDArrays.
  A key may also be an integer, which stands for its decimal string (`3` is
  the key \"3\", as in the Rust API and MXNet's Python), alone or in a vector
  (`[3 \"3\" 5]`).
  `push`, `pull`, `pushpull` and `broadcast` repeat a single key for each of a
  vector of values (or outs); `init` does not. Pushing a key several times in
  one call sums its values. Functions that change the store return it, so
  calls thread with `->`:

      (-> (create)
          (init \"3\" (ndarray/ones [2 1]))
          (push \"3\" (ndarray/* (ndarray/ones [2 1]) 4))
          (pull \"3\" out))

  Optimizers (`org.apache.clojure-mxnet.optimizer`) are installed with
  `set-optimizer`; their state is saved and loaded with
  `save-optimizer-states` / `load-optimizer-states`.

  Non-blocking calls: `push-async`, `pull-async`, `pushpull-async` and
  `broadcast-async` take the arguments of their blocking twins, checked by the
  same code, and return at once a value to `deref` (see `push-async`);
  `wait-all` waits for every call.

  Row-sparse keys (an addition): `init` and `push` take row-sparse arrays
  (`org.apache.clojure-mxnet.sparse`), `row-sparse-pull` returns the rows asked
  for, `stype` tells a key's storage type.

  Additions: `set-updater` (a Clojure fn as the updater), `pushpull`,
  `broadcast`, `optimizer-name`, `keys` (the keys, in init order), `version`
  (the library's), and `(pull kvstore ks)`, which returns the value of a key
  as a new NDArray (a vector of them for a vector of keys). A store prints as
  `#kvstore/store {:kind \"local\", :keys 3}` (its kind and number of keys;
  `#kvstore/store {:closed true}` once disposed), the Java `toString`.
  Fixed: `barrier` works (clojure-mxnet passed the store twice);
  `send-command-to-servers` is callable; `create` rejects unknown kinds.

  Errors are `ex-info`. Arguments are checked with spec first, and the
  message shows the argument given (`Invalid keys: [\"a\" 3.5]`): \"Invalid
  kvstore\" (not a store, e.g. nil), \"Invalid keys\", \"Invalid values\",
  \"Invalid outs\", \"Invalid priority\", \"Invalid node-id\", \"Invalid head\"
  (numbers must fit a Java int), \"Invalid body\", \"Invalid optimizer\",
  \"Invalid filename\" (data: `s/explain-data` plus
  `{:kvstore/error :invalid-argument}`). Errors of the store carry
  `{:kvstore/error :key-not-initialized ...}` (the keyword of the
  `KVStoreException` code: `:already-initialized :shape-mismatch
  :dtype-mismatch :length-mismatch :unknown-store-kind :device-unavailable
  :unsupported :invalid-argument :disposed :io :backend :resource-exhausted
  :internal`), with the
  Java exception as cause."
  (:refer-clojure :exclude [keys type])
  (:require [clojure.spec.alpha :as s]
            [org.apache.clojure-mxnet.util :as util])
  (:import (io.github.kvstore KVStore KVStoreException NDArray Optimizer RowSparse Updater)
           (java.io Writer)
           (java.util.concurrent CompletableFuture ExecutionException TimeUnit TimeoutException)))

(set! *warn-on-reflection* true)

(s/def ::name string?)
(s/def ::key (s/or :string string?
                   :integer integer?))
(s/def ::ks (s/or :key ::key
                  :vec-of-keys (s/coll-of ::key :kind vector?)))
(s/def ::ndarray #(instance? NDArray %))
(s/def ::vs (s/or :ndarray ::ndarray
                  :vec-of-ndarray (s/coll-of ::ndarray :kind vector?)))
(s/def ::outs (s/or :ndarray ::ndarray
                    :vec-of-ndarray (s/coll-of ::ndarray :kind vector?)))
(s/def ::kvstore #(instance? KVStore %))
(s/def ::priority util/int-value?)
(s/def ::node-id util/int-value?)
(s/def ::head util/int-value?)
(s/def ::body string?)
(defn- updater-fn?
  "Whether `x` can be called as an updater: a fn, a multimethod, or a var
  whose value is one. Keywords, symbols, maps, sets and vectors are invocable
  too, but as look-ups: installed as updaters they would fail only at the
  first push."
  [x]
  (or (fn? x)
      (instance? clojure.lang.MultiFn x)
      (and (var? x) (updater-fn? (deref x)))))

(s/def ::updater (s/nilable (s/or :updater #(instance? Updater %)
                                 :fn updater-fn?)))

;; Hand-written equivalents of the specs above, checked first so that valid
;; arguments (the hot path of push and pull) skip spec; spec still produces the
;; error and its explain-data. Loops, not every?: these run on every call.
(defn- vector-of? [pred x]
  (and (vector? x)
       (let [^clojure.lang.IPersistentVector v x
             n (.count v)]
         (loop [i 0]
           (cond
             (== i n) true
             (pred (.nth v i)) (recur (inc i))
             :else false)))))

(defn- ndarray? [x]
  (instance? NDArray x))

(defn- key? [k]
  (or (string? k) (integer? k)))

(defn- ks? [ks]
  (or (key? ks) (vector-of? key? ks)))

(defn- key-str
  "The key `k` as the Java API takes it: a string as is, an integer as its
  decimal string (`3` -> \"3\")."
  ^String [k]
  (if (string? k) k (str k)))

(defn- ndarrays? [vs]
  (or (instance? NDArray vs) (vector-of? ndarray? vs)))

(defn- kvstore? [x]
  (instance? KVStore x))

(defn- row-sparse? [x]
  (instance? RowSparse x))

(defn- row-sparse-values?
  "Whether `vs` is a row-sparse array or a non-empty vector of them."
  [vs]
  (or (row-sparse? vs)
      (and (vector? vs) (pos? (count vs)) (vector-of? row-sparse? vs))))

(defn- row-sparse-array
  "The row-sparse arrays `vs` (a vector) as a RowSparse[]."
  ^"[Lio.github.kvstore.RowSparse;" [vs]
  (into-array RowSparse vs))

(defmacro ^:private check!
  "`(util/validate! spec x msg)`, evaluated only when `(fast? x)` is false."
  [fast? spec x msg]
  `(when-not (~fast? ~x)
     (util/validate! ~spec ~x ~msg)))

(defn- key-array
  "The keys `ks` (a vector of strings and integers) as a String[]. (Filled by
  hand: into-array costs more than the native push of a small key.)"
  ^"[Ljava.lang.String;" [ks]
  (let [^clojure.lang.IPersistentVector v ks
        n (.count v)
        ^"[Ljava.lang.String;" a (make-array String n)]
    (dotimes [i n]
      (aset a i (key-str (.nth v i))))
    a))

(defn- ndarray-array
  "The NDArrays `vs` (a vector) as an NDArray[]."
  ^"[Lio.github.kvstore.NDArray;" [vs]
  (let [^clojure.lang.IPersistentVector v vs
        n (.count v)
        ^"[Lio.github.kvstore.NDArray;" a (make-array NDArray n)]
    (dotimes [i n]
      (aset a i ^NDArray (.nth v i)))
    a))

(defn- as-vector
  "`x` if it is a vector, else `[x]`."
  [x]
  (if (vector? x) x [x]))

(defn- key-array-for
  "The String[] of keys for the values `vals`: `ks` (a vector) itself, or the
  single key `ks` repeated once per value."
  ^"[Ljava.lang.String;" [ks vals]
  (if (vector? ks)
    (key-array ks)
    (let [^"[Ljava.lang.String;" a (make-array String (count vals))]
      (java.util.Arrays/fill a ^Object (key-str ks))
      a)))

(defn create
  "A new store of kind `name` (default \"local\"): \"local\" reduces on the
  host, \"device\" on the devices of the pushed arrays (case-insensitive).
  \"dist_sync\" is one store shared by every process of an MPI job
  (`mpirun -np 2 java ...`), in a jar built with MPI support (see
  `mpi-supported?`); a program that creates one calls `finalize-mpi` on every
  rank at its end. \"dist_sync\" without MPI support, \"dist_async\" and
  \"nccl\" are `{:kvstore/error :unsupported}`; an unknown kind is
  `{:kvstore/error :unknown-store-kind}` (MXNet made it a local store).
  The store's native memory is freed by `dispose`, or once it is unreachable."
  ([name]
   (util/validate! ::name name "Invalid name")
   (util/with-kvstore-errors :create
     (KVStore/create ^String name)))
  ([]
   (create "local")))

(defn dispose
  "Releases the store's native memory. Idempotent; any later use of the store
  is `{:kvstore/error :disposed}`."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :dispose
    (.dispose kvstore))
  nil)

(defn init
  "Initializes a key or a vector of keys `ks` with a value or a vector of
  values `vs` (copied). Every key must be initialized once, before push and
  pull. In a distributed store only rank 0's values are used. Returns the
  store. Row-sparse values (`org.apache.clojure-mxnet.sparse`) make row-sparse
  keys, which `row-sparse-pull` reads."
  [^KVStore kvstore ks vs]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (check! ks? ::ks ks "Invalid keys")
  (if (row-sparse-values? vs)
    (util/with-kvstore-errors :init
      (doto kvstore
        (.initRowSparse (key-array (as-vector ks)) (row-sparse-array (as-vector vs)))))
    (do
      (check! ndarrays? ::vs vs "Invalid values")
      (util/with-kvstore-errors :init
        (doto kvstore
          (.init (key-array (as-vector ks)) (ndarray-array (as-vector vs))))))))

;; push, pull, pushpull and broadcast, blocking or not: one helper per call kind
;; checks the arguments and makes the call, on the store (blocking, which returns
;; the store) or on its non-blocking view `(.async kvstore)` (which returns a
;; CompletableFuture). Both take the same argument forms.

(defmacro ^:private on
  "`(. kvstore method args...)` when `async?` is false, else the same call on
  `(.async kvstore)`; `kvstore` is a symbol hinted ^KVStore."
  [async? kvstore method & args]
  `(if ~async?
     (. (.async ~kvstore) ~method ~@args)
     (. ~kvstore ~method ~@args)))

(defn- push-call
  "Checks `push`'s arguments, then pushes, blocking or, when `async?`, not."
  [async? ^KVStore kvstore ks vs priority]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (check! ks? ::ks ks "Invalid keys")
  (check! ndarrays? ::vs vs "Invalid values")
  (check! util/int-value? ::priority priority "Invalid priority")
  (let [store-vals (ndarray-array (as-vector vs))]
    (if (vector? ks)
      (on async? kvstore push (key-array ks) store-vals (int priority))
      (on async? kvstore push (key-str ks) store-vals (int priority)))))

(defn- pull-call
  "Checks the arguments of `pull` into outs, then pulls, blocking or, when
  `async?`, not."
  [async? ^KVStore kvstore ks outs priority]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (check! ks? ::ks ks "Invalid keys")
  (check! ndarrays? ::outs outs "Invalid outs")
  (check! util/int-value? ::priority priority "Invalid priority")
  (let [store-outs (ndarray-array (as-vector outs))]
    (if (vector? ks)
      (on async? kvstore pull (key-array ks) store-outs (int priority))
      (on async? kvstore pull (key-str ks) store-outs (int priority)))))

(defn- pushpull-call
  "Checks `pushpull`'s arguments, then pushes and pulls, blocking or, when
  `async?`, not. `outs` is `::in-place` for the arity without outs (and without
  priority), which writes the result back into the values."
  [async? ^KVStore kvstore ks vs outs priority]
  (let [in-place? (identical? outs ::in-place)]
    (check! kvstore? ::kvstore kvstore "Invalid kvstore")
    (check! ks? ::ks ks "Invalid keys")
    (check! ndarrays? ::vs vs "Invalid values")
    (when-not in-place?
      (check! ndarrays? ::outs outs "Invalid outs")
      (check! util/int-value? ::priority priority "Invalid priority"))
    (let [store-vals (ndarray-array (as-vector vs))]
      (cond
        (and in-place? (vector? ks)) (on async? kvstore pushpull (key-array ks) store-vals)
        in-place? (on async? kvstore pushpull (key-str ks) store-vals)
        :else (let [store-outs (ndarray-array (as-vector outs))]
                (if (vector? ks)
                  (on async? kvstore pushpull (key-array ks) store-vals store-outs (int priority))
                  (on async? kvstore pushpull (key-str ks) store-vals store-outs (int priority))))))))

(defn- broadcast-call
  "Checks `broadcast`'s arguments, then broadcasts, blocking or, when `async?`,
  not (non-blocking for the pull only: the keys are initialized before it
  returns)."
  [async? ^KVStore kvstore ks vs outs priority]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (check! ks? ::ks ks "Invalid keys")
  (check! ndarrays? ::vs vs "Invalid values")
  (check! ndarrays? ::outs outs "Invalid outs")
  (check! util/int-value? ::priority priority "Invalid priority")
  (let [store-vals (as-vector vs)
        store-outs (ndarray-array (as-vector outs))]
    (if (and (not (vector? ks)) (= 1 (count store-vals)))
      (on async? kvstore broadcast (key-str ks) ^NDArray (first store-vals) store-outs (int priority))
      ;; Several values for one key: the key is repeated for each value (and
      ;; each out), which the store rejects as a duplicate init.
      (on async? kvstore broadcast (key-array-for ks store-vals) (ndarray-array store-vals)
          store-outs (int priority)))))

(defn push
  "Pushes a value or a vector of values `vs` to a key or a vector of keys
  `ks`. A single key with a vector of values is repeated for each value. The
  values of each key are summed, then the updater (default: assign) merges the
  sum into the stored value. `priority` (default 0) never changes results.
  Returns the store.

  Row-sparse values (`org.apache.clojure-mxnet.sparse`; every value of the call
  row-sparse) are summed row by row; with no updater the sum replaces the whole
  value, lazy optimizers (SGD and Adam with `lazy_update`, AdaGrad, Ftrl)
  update only the pushed rows."
  ([^KVStore kvstore ks vs priority]
   (if (row-sparse-values? vs)
     (do
       (check! kvstore? ::kvstore kvstore "Invalid kvstore")
       (check! ks? ::ks ks "Invalid keys")
       (check! util/int-value? ::priority priority "Invalid priority")
       (let [vals (as-vector vs)]
         (util/with-kvstore-errors :push
           (.pushRowSparse kvstore (key-array-for ks vals) (row-sparse-array vals) (int priority)))))
     (util/with-kvstore-errors :push
       (push-call false kvstore ks vs priority)))
   kvstore)
  ([kvstore ks vs]
   (push kvstore ks vs 0)))

(defn- pull-new
  "The values of the keys `ks` (a vector) as new NDArrays, in a vector; on an
  error, the arrays made so far are closed."
  [^KVStore kvstore ks]
  (let [made (java.util.ArrayList.)]
    (try
      (doseq [k ks]
        (.add made (.pull kvstore (key-str k))))
      (vec made)
      (catch Throwable t
        (doseq [^NDArray a made]
          (.close a))
        (throw t)))))

(defn pull
  "Copies the values of a key or a vector of keys `ks` into an out or a
  vector of outs `outs`. A single key with a vector of outs is repeated for
  each out. Returns the store.

  With no `outs`, returns the value of the key `ks` as a new NDArray on
  `(cpu 0)` of the value's shape and dtype, or, for a vector of keys, a
  vector of new NDArrays, one per key (an addition to clojure-mxnet, whose
  pull always wrote into outs)."
  ([^KVStore kvstore ks]
   (check! kvstore? ::kvstore kvstore "Invalid kvstore")
   (check! ks? ::ks ks "Invalid keys")
   (util/with-kvstore-errors :pull
     (if (vector? ks)
       (pull-new kvstore ks)
       (.pull kvstore (key-str ks)))))
  ([kvstore ks outs priority]
   (util/with-kvstore-errors :pull
     (pull-call false kvstore ks outs priority))
   kvstore)
  ([kvstore ks outs]
   (pull kvstore ks outs 0)))

(defn row-sparse-pull
  "The rows `row-ids` (integers, any order, repeats allowed; one that does not
  fit a long, such as a BigInt of 2^64 + 3, is \"Invalid row-ids\",
  `{:kvstore/error :invalid-argument}`, not wrapped) of the row-sparse
  key `ks`, as a new row-sparse array whose indices are those ids sorted and
  de-duplicated (only those rows are copied); for a vector of keys, a vector
  of them, with `row-ids` a vector of id vectors, one per key. The caller owns
  the results (`sparse/close`). An addition to clojure-mxnet (MXNet's
  `row_sparse_pull`, returning the rows instead of filling outs)."
  ([kvstore ks row-ids]
   (row-sparse-pull kvstore ks row-ids 0))
  ([^KVStore kvstore ks row-ids priority]
   (check! kvstore? ::kvstore kvstore "Invalid kvstore")
   (check! ks? ::ks ks "Invalid keys")
   (check! util/int-value? ::priority priority "Invalid priority")
   (let [ids? #(and (sequential? %) (every? util/long-value? %))]
     (if (vector? ks)
       (do
         (when-not (and (vector? row-ids) (= (count ks) (count row-ids)) (every? ids? row-ids))
           (util/validate! (s/coll-of (s/coll-of util/long-value? :kind sequential?) :kind vector? :count (count ks))
                           row-ids "Invalid row-ids"))
         (let [made (java.util.ArrayList.)]
           (try
             (util/with-kvstore-errors :row-sparse-pull
               (doseq [[k ids] (map vector ks row-ids)]
                 (.add made (.rowSparsePull kvstore (key-str k) (long-array ids) (int priority)))))
             (vec made)
             (catch Throwable t
               (doseq [^RowSparse r made]
                 (.close r))
               (throw t)))))
       (do
         (when-not (ids? row-ids)
           (util/validate! (s/coll-of util/long-value? :kind sequential?) row-ids "Invalid row-ids"))
         (util/with-kvstore-errors :row-sparse-pull
           (.rowSparsePull kvstore (key-str ks) (long-array row-ids) (int priority))))))))

(defn stype
  "The storage type of the key `k`: `:row-sparse` (initialized with, or
  assigned, a row-sparse value) or `:default`."
  [^KVStore kvstore k]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (check! key? ::key k "Invalid key")
  (util/with-kvstore-errors :stype
    (if (= "row_sparse" (.stype kvstore (key-str k))) :row-sparse :default)))

(defn pushpull
  "Push then pull as one step (no other push to the key comes in between).
  With no `outs` the result is written back into the values `vs` themselves.
  A single key is repeated for each value and for each out. Returns the store."
  ([kvstore ks vs]
   (util/with-kvstore-errors :pushpull
     (pushpull-call false kvstore ks vs ::in-place 0))
   kvstore)
  ([kvstore ks vs outs]
   (pushpull kvstore ks vs outs 0))
  ([kvstore ks vs outs priority]
   (util/with-kvstore-errors :pushpull
     (pushpull-call false kvstore ks vs outs priority))
   kvstore))

(defn broadcast
  "Initializes the keys `ks` with the values `vs`, then pulls them into
  `outs`, as one step. A single key with a single value is pulled into each
  of a vector of outs. Broadcasting a key that is already initialized is
  `{:kvstore/error :already-initialized}`. Returns the store."
  ([kvstore ks vs outs]
   (broadcast kvstore ks vs outs 0))
  ([kvstore ks vs outs priority]
   (util/with-kvstore-errors :broadcast
     (broadcast-call false kvstore ks vs outs priority))
   kvstore))

(defn- pending
  "What the `-async` functions return: `deref` waits for the call and returns
  the store, or throws the `ex-info` the blocking call throws; `(deref p ms
  timeout-val)` gives up after `ms` milliseconds; `realized?` says whether the
  call is done."
  [op kvstore ^CompletableFuture f]
  (letfn [(rethrow [^ExecutionException e]
            (let [cause (.getCause e)]
              (throw (if (instance? KVStoreException cause)
                       (util/kvstore-exception->ex-info cause op)
                       cause))))]
    (reify
      clojure.lang.IDeref
      (deref [_]
        (try (.get f) kvstore
             (catch ExecutionException e (rethrow e))))
      clojure.lang.IBlockingDeref
      (deref [_ ms timeout-val]
        (try (.get f (long ms) TimeUnit/MILLISECONDS) kvstore
             (catch TimeoutException _ timeout-val)
             (catch ExecutionException e (rethrow e))))
      clojure.lang.IPending
      (isRealized [_] (.isDone f)))))

(defn push-async
  "`push`, non-blocking: the values may be reused as soon as it returns (the
  push sums what they held when it was made: a write before the push read
  one copies it for the push first), and the sums and updates run on the
  store's threads. Calls on the
  same key take effect in the order they were made. Returns a pending value:
  `@p` waits and returns the store, or throws the `ex-info` `push` throws;
  `(deref p ms timeout-val)` waits at most `ms` milliseconds. What is found
  before the call is made (an invalid argument, a disposed array:
  `{:kvstore/error :disposed}`) is thrown at once, as the same `ex-info`. (A
  disposed array's call is made all the same, so that on a store shared with
  other workers, \"dist_sync\" under mpirun, every worker fails it as that
  call: the others with `:invalid-argument` naming this rank's refusal.)"
  ([kvstore ks vs]
   (push-async kvstore ks vs 0))
  ([kvstore ks vs priority]
   (pending :push kvstore (util/with-kvstore-errors :push
                            (push-call true kvstore ks vs priority)))))

(defn pull-async
  "`pull` into `outs`, non-blocking: the outs are written later, after the
  calls made before on their keys; until then every read of them (`->vec`,
  printing, using one in another call) waits. Returns a pending value, as
  `push-async`."
  ([kvstore ks outs]
   (pull-async kvstore ks outs 0))
  ([kvstore ks outs priority]
   (pending :pull kvstore (util/with-kvstore-errors :pull
                            (pull-call true kvstore ks outs priority)))))

(defn pushpull-async
  "`pushpull`, non-blocking (the values may be reused at once; the outs, or the values
  themselves with no `outs`, are written later). Returns a pending value, as
  `push-async`."
  ([kvstore ks vs]
   (pending :pushpull kvstore (util/with-kvstore-errors :pushpull
                                (pushpull-call true kvstore ks vs ::in-place 0))))
  ([kvstore ks vs outs]
   (pushpull-async kvstore ks vs outs 0))
  ([kvstore ks vs outs priority]
   (pending :pushpull kvstore (util/with-kvstore-errors :pushpull
                                (pushpull-call true kvstore ks vs outs priority)))))

(defn broadcast-async
  "`broadcast`, non-blocking for its pull: the keys are initialized before it
  returns, the outs written later. Returns a pending value, as `push-async`."
  ([kvstore ks vs outs]
   (broadcast-async kvstore ks vs outs 0))
  ([kvstore ks vs outs priority]
   (pending :broadcast kvstore (util/with-kvstore-errors :broadcast
                                 (broadcast-call true kvstore ks vs outs priority)))))

(defn wait-all
  "Waits until every call made so far on the store has finished (MXNet's
  `WaitAll`); each non-blocking call reports its error to its own pending
  value. Returns the store."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :wait-all
    (.waitAll kvstore)))

(defn- ->updater
  ^Updater [f]
  (cond
    (nil? f) nil
    (instance? Updater f) f
    :else (reify Updater
            (update [_ key _index merged stored]
              (f key merged stored)))))

(defn set-updater
  "Installs `updater` as the store's updater: a fn of `[key input stored]`
  called once per distinct key of each push with the key (a string), the sum
  of the pushed values and the stored value, which it updates in place, e.g.
  `(fn [key input stored] (ndarray/+= stored (ndarray/* input 2)))`. It runs
  on the thread that pushes; `input` and `stored` are valid only during the
  call. If it throws, the push fails with `{:kvstore/error :backend}` (the
  fn's exception is the root cause) and the store keeps its value. It may not
  call the store that runs it (`{:kvstore/error :invalid-argument}`); calls to
  other stores fail instead of waiting when a key there is busy, and pushes
  nested through updaters may be at most 8 deep on one thread. An
  `io.github.kvstore.Updater` is used as is, and so is a multimethod or a var
  holding a fn; nil restores the default (assign). Anything else (a keyword, a
  map, a set, a vector, ...: invocable, but not as an updater) is \"Invalid
  updater\", `{:kvstore/error :invalid-argument}`, here rather than at the
  first push. Pushes in flight finish with the updater they started with:
  this call waits for them. The store keeps `updater` alive as long as the
  store is reachable (a fn that closes over the store does not keep it
  alive). Returns the store."
  [^KVStore kvstore updater]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/validate! ::updater updater "Invalid updater")
  (util/with-kvstore-errors :set-updater
    (doto kvstore
      (.setUpdater (->updater updater)))))

(defn version
  "The version of the library (the jar's, its native library's and the Rust
  crates'), for example \"0.1.0\"."
  []
  (KVStore/version))

(defn keys
  "The keys of the store, a vector of strings, in the order they were first
  initialized (integer keys as their decimal strings)."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :keys
    (vec (.keys kvstore))))

(defmethod print-method KVStore [^KVStore kvstore ^Writer w]
  ;; The Java toString: `#kvstore/store {:kind "local", :keys 3}`; it never throws,
  ;; so a disposed store prints too.
  (.write w (.toString kvstore)))

(defmethod print-dup KVStore [kvstore w]
  ;; A store lives in native memory: there is no form that reads back as one, so
  ;; print-dup shows the same facts (reading the tag back is an error).
  (print-method kvstore w))

(defn type
  "The kind of the store: \"local\", \"device\", \"dist_sync\"..."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :type
    (.type kvstore)))

(defn mpi-supported?
  "Whether this jar's native library supports \"dist_sync\" over MPI
  (target/kvstore-mpi.jar, built by `make jar FEATURES=mpi`)."
  []
  (KVStore/mpiSupported))

(defn finalize-mpi
  "Ends MPI at the end of a \"dist_sync\" program: call it once on every rank,
  after the last store call. A process that created a \"dist_sync\" store and
  exits without it, normally or through an exception, aborts the whole MPI job
  (fail-stop: the other ranks never wait forever for a worker that is gone).
  Does nothing in a jar without MPI support. Returns nil."
  []
  (util/with-kvstore-errors :finalize-mpi
    (KVStore/finalizeMpi))
  nil)

(defn num-workers
  "The number of worker processes (1 unless distributed)."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :num-workers
    (.numWorkers kvstore)))

(defn rank
  "The rank of this worker, in [0, num-workers)."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :rank
    (.rank kvstore)))

(defn barrier
  "Waits until every worker has reached the barrier (does nothing for a
  single worker). Returns the store."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :barrier
    (doto kvstore
      (.barrier))))

(defn num-dead-node
  "The number of dead nodes in the group `node-id` (0 on a local store)."
  [^KVStore kvstore node-id]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/validate! ::node-id node-id "Invalid node-id")
  (util/with-kvstore-errors :num-dead-node
    (.numDeadNode kvstore (int node-id))))

(defn set-barrier-before-exit
  "Whether disposing the store waits at a barrier first. Returns the store."
  [^KVStore kvstore barrier-before-exit]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :set-barrier-before-exit
    (doto kvstore
      (.setBarrierBeforeExit (boolean barrier-before-exit)))))

(defn send-command-to-servers
  "Sends the command `head` (an int) with `body` (a string) to the servers
  (nothing to do on a local store). Returns the store."
  [^KVStore kvstore head body]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/validate! ::head head "Invalid head")
  (util/validate! ::body body "Invalid body")
  (util/with-kvstore-errors :send-command-to-servers
    (doto kvstore
      (.sendCommandToServers (int head) ^String body))))

(s/def ::compression-params (s/map-of (s/or :k keyword? :s string?) some?))

(defn set-gradient-compression
  "Sets MXNet's 2-bit gradient compression on a \"device\" or \"dist_sync\"
  store, from a map such as `{:type \"2bit\" :threshold 0.5}` (keyword or
  string keys; every value is sent as its string, as MXNet does): every value
  pushed from then on, even a single one, is quantised to -t, 0 or +t with a
  residual per key and per position in the push's values that carries what was
  not sent to the next push (under dist_sync each worker quantises its own sum
  of a key, and the workers exchange 2-bit codes). `init` and `pull` are not
  compressed; values must be float32.
  `:threshold` defaults to 0.5 and must be above 0 (`:invalid-argument`); a
  \"local\" store answers `:unsupported`, as MXNet. Returns the store."
  [^KVStore kvstore params]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/validate! ::compression-params params "Invalid compression params")
  (util/with-kvstore-errors :set-gradient-compression
    (doto kvstore
      (.setGradientCompression
       (java.util.HashMap. ^java.util.Map (into {} (map (fn [[k v]] [(if (keyword? k) (name k) k) (str v)])) params))))))

(s/def ::optimizer #(instance? Optimizer %))

(defn set-optimizer
  "Registers `optimizer` (from `org.apache.clojure-mxnet.optimizer`) with the
  store: every later push of gradients to a key updates the key's value, its
  weight, with the optimizer; the optimizer's per-key state lives in the
  store. Replaces any updater or earlier optimizer (every key's state starts
  afresh). Returns the store."
  [^KVStore kvstore optimizer]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/validate! ::optimizer optimizer "Invalid optimizer")
  (util/with-kvstore-errors :set-optimizer
    (doto kvstore
      (.setOptimizer ^Optimizer optimizer))))

(defn optimizer-name
  "The MXNet name of the optimizer registered with the store (\"sgd\",
  \"adam\", ...), or nil when there is none."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :optimizer-name
    (.optimizerName kvstore)))

(s/def ::fname string?)

(defn- file-call
  "Checks the store and the file name, then calls `(f kvstore fname)` as the
  operation `op`; returns the store."
  [kvstore fname op f]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/validate! ::fname fname "Invalid filename")
  (util/with-kvstore-errors op
    (f kvstore fname)
    kvstore))

(defn save-optimizer-states
  "Saves the optimizer (updater) state to the file `fname`: every key's state
  and update count and the schedule's position. Returns the store.
  No optimizer registered is `{:kvstore/error :invalid-argument}`; a file that
  cannot be written `{:kvstore/error :io}`."
  [^KVStore kvstore fname]
  (file-call kvstore fname :save-optimizer-states #(.saveOptimizerStates ^KVStore %1 ^String %2)))

(defn load-optimizer-states
  "Loads the optimizer (updater) state from the file `fname` (written by
  `save-optimizer-states`), so that training continues where it was saved.
  All or nothing. Returns the store. A missing or corrupted file is
  `{:kvstore/error :io}`; no optimizer registered, or a file of another
  optimizer, `{:kvstore/error :invalid-argument}`; a key of the file that the
  store lacks `{:kvstore/error :key-not-initialized}`."
  [^KVStore kvstore fname]
  (file-call kvstore fname :load-optimizer-states #(.loadOptimizerStates ^KVStore %1 ^String %2)))

(defn save-checkpoint
  "Saves the whole store to the file `fname`: every key's name, shape, dtype
  and value, the optimizer with its hyper-parameters, every key's optimizer
  state and update count, and the schedule's state, each tensor with a CRC-32.
  One consistent step: it waits for the calls made before it. Under dist_sync
  every worker calls it at the same point; rank 0 writes, and every worker
  returns once the file is durable. Returns the store. A path that is not a
  regular file is `{:kvstore/error :invalid-argument}`; a file that cannot be
  written `{:kvstore/error :io}`."
  [^KVStore kvstore fname]
  (file-call kvstore fname :save-checkpoint #(.saveCheckpoint ^KVStore %1 ^String %2)))

(defn load-checkpoint
  "Loads a file of `save-checkpoint` into the store, of any kind and on any
  number of workers: every key of the file gets its value (new keys are
  initialised), and the file's optimizer is installed in the state it was
  saved in, so training resumes exactly. All or nothing. Under dist_sync every
  worker loads the same file, or all fail. Returns the store. A missing or
  damaged file is `{:kvstore/error :io}`; workers that read different files
  `{:kvstore/error :invalid-argument}`; a key of the store with another shape
  `{:kvstore/error :shape-mismatch}`."
  [^KVStore kvstore fname]
  (file-call kvstore fname :load-checkpoint #(.loadCheckpoint ^KVStore %1 ^String %2)))

;;; Where the time goes: the timeline and the counters.

(defn start-timeline
  "Starts writing the timeline of this process's stores to the file `fname`:
  Chrome Trace Event Format JSON, which Perfetto and chrome://tracing open
  (as KVSTORE_TIMELINE=fname does for a whole program; docs/timeline.md).
  Under dist_sync each worker writes its own file beside it until
  `stop-timeline`. Returns the store. A file that cannot be made is
  `{:kvstore/error :io}`."
  [^KVStore kvstore fname]
  (file-call kvstore fname :start-timeline #(.startTimeline ^KVStore %1 ^String %2)))

(defn stop-timeline
  "Stops the timeline and closes its file; under dist_sync (every worker
  calls it, as `barrier`) worker 0 merges every worker's file into the path it
  was started with. Returns the path of the file written here (the merged one
  on worker 0), or nil when the timeline was off."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :stop-timeline
    (.stopTimeline kvstore)))

(defn stats
  "What the store did since it was made or `reset-stats`, as a map:
  `:calls` (by kind, `{\"push\" {:calls n :keys n} ...}`), `:bytes-pushed`,
  `:bytes-pulled`, `:wire-bytes-sent`, `:wire-bytes-received`, `:phases`
  (seconds in each phase: `\"queued\"`, `\"sum\"`, `\"wire\"`, `\"update\"`,
  `\"copy\"`, `\"ranks\"`), `:collectives` and, under dist_sync, `:ranks`
  (per worker `{:rank r :held-up-s t :last n :mean-lateness-s x}`: how long it
  held the others up in all, what names the slowest worker; at how many
  collectives it arrived last, more than 1 ms after the median of the others;
  and its mean lateness), and `:held`, the bytes the store holds on this worker
  now (`{:values n :state n :buffers n}`: values, optimizer state, push buffers;
  under dist_sync with owners, this worker's part of the state)."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :stats
    (let [^io.github.kvstore.Stats s (.stats kvstore)]
      {:calls (into {} (for [[kind n] (.calls s)]
                         [kind {:calls n :keys (get (.keys s) kind)}]))
       :bytes-pushed (.bytesPushed s)
       :bytes-pulled (.bytesPulled s)
       :wire-bytes-sent (.wireBytesSent s)
       :wire-bytes-received (.wireBytesReceived s)
       :phases (into {} (.phaseSeconds s))
       :collectives (.collectives s)
       :ranks (mapv (fn [^io.github.kvstore.Stats$Rank r]
                      {:rank (.rank r) :held-up-s (.heldUpSeconds r) :last (.last r)
                       :mean-lateness-s (.meanLatenessSeconds r)})
                    (.ranks s))
       :held (let [^io.github.kvstore.Stats$Held h (.held s)]
               {:values (.values h) :state (.state h) :buffers (.buffers h)})})))

(defn reset-stats
  "Sets the store's counters (`stats`) to zero. Returns the store."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :reset-stats
    (doto kvstore
      (.resetStats))))

;;; Commits: a job that lost a rank resumes from its last commit.

(s/def ::step integer?)
(s/def ::extra #(or (bytes? %) (string? %)))

(defn commit
  "Commits the whole store as of this call (every key's value, the optimizer
  and its state, this rank's compression residuals, `step` and `extra`, the
  program's own bytes: a byte array, or
  a string, kept as its UTF-8 bytes) into memory that outlives the process
  (/dev/shm): a store made later by a run of the same job (KVSTORE_JOB, which
  kvstore-run sets) restores it (`restored`). Under dist_sync and dist_async
  a collective, like `barrier`. Returns the store. A store made without a job name is
  `{:kvstore/error :invalid-argument}`."
  ([^KVStore kvstore step]
   (commit kvstore step (byte-array 0)))
  ([^KVStore kvstore step extra]
   (check! kvstore? ::kvstore kvstore "Invalid kvstore")
   (check! integer? ::step step "The step must be an integer")
   (check! bytes? ::extra extra "extra must be a byte array or a string")
   (let [^bytes extra (if (string? extra) (.getBytes ^String extra "UTF-8") extra)]
     (util/with-kvstore-errors :commit
       (doto kvstore
         (.commit (long step) extra))))))

(defn restored
  "The commit this store resumed from when it was made (see `commit`):
  `{:step s :extra bytes}`, or nil."
  [^KVStore kvstore]
  (check! kvstore? ::kvstore kvstore "Invalid kvstore")
  (util/with-kvstore-errors :restored
    (when-let [^io.github.kvstore.Restored r (.restored kvstore)]
      {:step (.step r) :extra (.extra r)})))
