(ns org.apache.clojure-mxnet.util
  "Helpers shared by the kvstore, ndarray and context namespaces: spec
  validation with clojure-mxnet's messages, and the one place where a Java
  `KVStoreException` becomes an `ex-info`.

  Every error that reaches a caller of these namespaces is an `ex-info` whose
  data has a `:kvstore/error` keyword:
  - argument validation (before any Java call): the message names the argument
    and shows the value given (`Invalid keys: [\"a\" 3.5]`, shortened if it is
    long; see `shown`) and the data is `(s/explain-data spec value)`, as in
    clojure-mxnet, plus
    `{:kvstore/error :invalid-argument, :kvstore/code \"INVALID_ARGUMENT\"}`;
  - an unknown key in an options map (see `check-options!`): the message names
    it and lists the options there are, `{:kvstore/error :invalid-argument}`;
  - an error of the store or of an array: the message is the Java message and
    the data is `{:kvstore/error :shape-mismatch, :kvstore/code \"SHAPE_MISMATCH\",
    :kvstore/op :push}` plus, when the error has them, `:key` (the key concerned,
    a string) and `:expected` / `:got` (the shapes of a shape mismatch as
    vectors of longs, the dtypes of a dtype mismatch as keywords such as
    `:float32`, the lengths of a length mismatch as longs; see
    `kvstore-exception-data`); the `KVStoreException` is the cause. The keyword is
    the code's name in lower case with dashes: `:key-not-initialized
    :already-initialized :shape-mismatch :dtype-mismatch :length-mismatch
    :unknown-store-kind :device-unavailable :unsupported :invalid-argument
    :disposed :io :backend :resource-exhausted :internal`;
  - a Java heap too small for what a call must build (a `java.lang.OutOfMemoryError`
    inside these namespaces' calls, or a size found too large for the heap
    before allocating): `{:kvstore/error :resource-exhausted}`, with the
    `OutOfMemoryError`, when there is one, as the cause."
  (:require [clojure.spec.alpha :as s]
            [clojure.string :as string])
  (:import (io.github.kvstore DType KVStoreException KVStoreException$Code)))

(set! *warn-on-reflection* true)

(def ^:private shown-chars
  "The most characters of a value that an error message shows."
  200)

(defn shown
  "`x` as `pr-str` prints it, for an error message: at most 20 elements and 4
  levels of each collection, and at most 200 characters (a longer form is cut
  and ends in \"...\"), so that a huge argument does not make a huge message."
  [x]
  (let [printed (try
                  (binding [*print-length* 20
                            *print-level* 4
                            *print-meta* false
                            *print-dup* false]
                    (pr-str x))
                  (catch Exception _
                    ;; A value whose printing fails still gets a message.
                    (str "a " (pr-str (class x)))))]
    (if (> (count printed) shown-chars)
      (str (subs printed 0 (- shown-chars 3)) "...")
      printed)))

(defn- own-frame?
  "True for a stack frame of this namespace or of Clojure itself."
  [^StackTraceElement frame]
  (let [c (.getClassName frame)]
    (or (.startsWith c "org.apache.clojure_mxnet.util$")
        (.startsWith c "clojure.core$")
        (.startsWith c "clojure.lang."))))

(defn- from-caller
  "`e` with the frames of this namespace and of Clojure cut from the top of its
  stack trace, so that it seems thrown by the function the user called: the
  REPL then says `invalid arguments to org.apache.clojure-mxnet.kvstore/push`,
  not `... to org.apache.clojure-mxnet.util/validate!`."
  [^Throwable e]
  (let [trace (vec (.getStackTrace e))
        kept (drop-while own-frame? trace)]
    (when (seq kept)
      (.setStackTrace e (into-array StackTraceElement kept)))
    e))

(defn validate!
  "Throws `ex-info` unless `value` conforms to `spec`: the message is
  `error-msg`, a colon and the value (see `shown`), as
  `Invalid keys: [\"a\" 3.5]`; the data is `(s/explain-data spec value)` plus
  `{:kvstore/error :invalid-argument :kvstore/code \"INVALID_ARGUMENT\"}`.
  Returns nil. Unlike clojure-mxnet it does not print `s/explain` to *out*:
  the explanation is in the exception's data."
  [spec value error-msg]
  (when-not (s/valid? spec value)
    (throw (from-caller
            (ex-info (str error-msg ": " (shown value))
                     (assoc (s/explain-data spec value)
                            :kvstore/error :invalid-argument
                            :kvstore/code "INVALID_ARGUMENT"))))))

(defn int-value?
  "True for an integer that fits a Java int (what the Java API takes)."
  [x]
  (and (int? x) (<= Integer/MIN_VALUE x Integer/MAX_VALUE)))

(defn long-value?
  "True for an integer that fits a Java long: what row ids and row-sparse
  indices are. A BigInt or BigInteger that fits is one; one that does not
  (`(+ (bigint Long/MAX_VALUE) 1)`) is not, where a conversion to long would
  wrap it silently (2^64 + 3 would be row 3)."
  [x]
  (or (int? x)
      (and (integer? x) (<= Long/MIN_VALUE x Long/MAX_VALUE))))

(defn code->keyword
  "The keyword for a `KVStoreException$Code` or its name:
  `SHAPE_MISMATCH` -> `:shape-mismatch`."
  [code]
  (-> (if (instance? KVStoreException$Code code)
        (.name ^KVStoreException$Code code)
        (str code))
      string/lower-case
      (string/replace "_" "-")
      keyword))

(defn- dtype->keyword
  "The keyword naming `d` as `ndarray/dtype-keyword` does (`:float32`), or nil."
  [^DType d]
  (some-> d .mxnetName keyword))

(defn kvstore-exception-data
  "The data that `e` carries besides its code, as a map with only the entries
  that apply: `:key` (the key concerned, a string), and `:expected` / `:got`:
  shapes as vectors of longs (`[2 3]`) for a shape mismatch, dtypes as
  keywords (`:float32`) for a dtype mismatch, lengths as longs for a length
  mismatch."
  [^KVStoreException e]
  (let [shapes (when-let [expected (.expectedShape e)]
                 [(vec expected) (vec (.gotShape e))])
        dtypes (when-let [expected (.expectedDType e)]
                 [(dtype->keyword expected) (dtype->keyword (.gotDType e))])
        lengths (when (.isPresent (.expectedLength e))
                  [(.getAsLong (.expectedLength e)) (.getAsLong (.gotLength e))])
        [expected got] (or shapes dtypes lengths)]
    (cond-> {}
      (.key e) (assoc :key (.key e))
      (some? expected) (assoc :expected expected)
      (some? got) (assoc :got got))))

(defn kvstore-exception->ex-info
  "The `ex-info` that stands for `e`: its message, `{:kvstore/error <keyword>
  :kvstore/code <code name> :kvstore/op op}`, the data of `e` (see
  `kvstore-exception-data`: `:key`, `:expected`, `:got`) and `extra` as data,
  `e` as cause."
  ([^KVStoreException e op]
   (kvstore-exception->ex-info e op nil))
  ([^KVStoreException e op extra]
   (let [code (or (some-> (.code e) (.name)) "INTERNAL")]
     (ex-info (or (.getMessage e) (str "kvstore error " code))
              (merge {:kvstore/error (code->keyword code)
                      :kvstore/code code
                      :kvstore/op op}
                     (kvstore-exception-data e)
                     extra)
              e))))

(defn resource-exhausted
  "The `ex-info` of a Java heap too small for operation `op`:
  `{:kvstore/error :resource-exhausted :kvstore/op op}` plus `data`, with
  `cause` (an `OutOfMemoryError`, or nil)."
  [op msg data cause]
  (ex-info msg
           (merge {:kvstore/error :resource-exhausted
                   :kvstore/code "RESOURCE_EXHAUSTED"
                   :kvstore/op op}
                  data)
           cause))

(defn out-of-memory->ex-info
  "The `ex-info` that stands for the `OutOfMemoryError` `e` thrown by operation
  `op` (see `resource-exhausted`)."
  [^OutOfMemoryError e op]
  (resource-exhausted op
                      (str (name op) ": the Java heap cannot hold the result ("
                           (.getMessage e) "); free memory, or raise -Xmx")
                      nil e))

(defmacro with-kvstore-errors
  "Evaluates `body`; a `KVStoreException` thrown by it is rethrown as an
  `ex-info` (see `kvstore-exception->ex-info`) naming the operation `op` (a
  keyword such as `:push`), and so is an `OutOfMemoryError` (see
  `out-of-memory->ex-info`): the Java arrays these calls build are as large as
  the user's arrays."
  [op & body]
  `(try
     ~@body
     (catch KVStoreException e#
       (throw (kvstore-exception->ex-info e# ~op)))
     (catch OutOfMemoryError e#
       (throw (out-of-memory->ex-info e# ~op)))))

(defn check-heap!
  "Throws the `:resource-exhausted` ex-info of operation `op` when `bytes` of
  Java heap are more than this JVM's maximum heap (`-Xmx`): a request that
  can never succeed is refused before it is tried (trying would first make the
  garbage collector work in vain). Returns nil."
  [op bytes what]
  (let [max-heap (.maxMemory (Runtime/getRuntime))]
    (when (> bytes max-heap)
      (throw (resource-exhausted op
                                 (str (name op) ": " what " would take " bytes
                                      " bytes of Java heap, more than its maximum, " max-heap
                                      " bytes (-Xmx)")
                                 {:bytes bytes :max-heap max-heap}
                                 nil)))))

(defn invalid-argument!
  "Throws the `ex-info` of an argument error found on the Clojure side that
  spec does not describe well: `{:kvstore/error :invalid-argument ...}`."
  [msg data]
  (throw (ex-info msg (merge {:kvstore/error :invalid-argument
                              :kvstore/code "INVALID_ARGUMENT"}
                             data))))

(defn check-options!
  "Throws the `:invalid-argument` ex-info of the keys of the options map
  `opts` that are not in `allowed` (a vector of keywords, in the order the
  message lists them): `unknown option :momentun for sgd; the options are
  :learning-rate, :momentum, ...`, where `fn-name` is \"sgd\". Its data is
  `{:unknown [:momentun] :options allowed}` plus `data`. (clojure-mxnet
  silently ignored a misspelt option.) Does nothing when `opts` is not a map:
  its spec says what is wrong then. Returns nil."
  [fn-name allowed opts data]
  (when (map? opts)
    (let [allowed-set (set allowed)
          unknown (vec (remove allowed-set (keys opts)))]
      (when (seq unknown)
        (invalid-argument! (str "unknown option" (when (next unknown) "s") " "
                                (string/join ", " (map shown unknown))
                                " for " fn-name "; the options are "
                                (string/join ", " allowed))
                           (merge {:unknown unknown :options allowed} data))))))

(s/def ::non-empty-seq (s/and sequential? not-empty))

(defn nd-seq-shape
  "The shape of a nested sequential structure of numbers, as a vector:
  `[[1 2 3] [4 5 6]]` -> `[2 3]`. Every row must have the same length."
  [nd-seq]
  (validate! ::non-empty-seq nd-seq "Invalid N-D sequence")
  (let [shape (loop [x nd-seq
                     shape []]
                (if (sequential? x)
                  (recur (first x) (conj shape (count x)))
                  shape))
        ragged? (fn ragged? [x [d & ds]]
                  (cond
                    (nil? d) (sequential? x)
                    (not (sequential? x)) true
                    (not= d (count x)) true
                    :else (boolean (some #(ragged? % ds) x))))]
    (when (ragged? nd-seq shape)
      (invalid-argument! "Invalid N-D sequence: rows of different lengths"
                         {:value nd-seq :shape shape}))
    shape))
