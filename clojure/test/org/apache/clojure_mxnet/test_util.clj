(ns org.apache.clojure-mxnet.test-util
  "Helpers for the tests: what an expression throws, read from `ex-data`.")

(set! *warn-on-reflection* true)

(defn thrown
  "The `ExceptionInfo` that calling `f` throws, or nil when it returns."
  [f]
  (try (f) nil
       (catch clojure.lang.ExceptionInfo e e)))

(defn error-of
  "The `:kvstore/error` of the ex-info that calling `f` throws, `:no-error`
  when it returns, `:no-kvstore-error` for an ex-info without one."
  [f]
  (if-let [e (thrown f)]
    (:kvstore/error (ex-data e) :no-kvstore-error)
    :no-error))

(defn spec-message-of
  "The message of the spec validation ex-info (one whose data is spec's
  explain-data) that calling `f` throws, or nil."
  [f]
  (when-let [e (thrown f)]
    (when (contains? (ex-data e) :clojure.spec.alpha/problems)
      (ex-message e))))

(defn root-cause
  "The innermost cause of `t`."
  [^Throwable t]
  (if-let [c (.getCause t)] (recur c) t))
