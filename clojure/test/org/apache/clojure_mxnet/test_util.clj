(ns org.apache.clojure-mxnet.test-util
  "Helpers for the tests: what an expression throws, read from `ex-data`."
  (:require [clojure.string :as string]
            [org.apache.clojure-mxnet.util :as util]))

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
  "What the spec validation ex-info (one whose data is spec's explain-data)
  that calling `f` throws says is invalid: its message is `<what>: <value>`,
  the value being the explain-data's `::s/value` as `util/shown` prints it,
  and this returns `<what>` (\"Invalid keys\"). A message without that exact
  value at its end is returned whole, so that comparing it with `<what>`
  fails; nil when `f` throws no such ex-info."
  [f]
  (when-let [e (thrown f)]
    (let [data (ex-data e)
          msg (ex-message e)
          suffix (str ": " (util/shown (:clojure.spec.alpha/value data)))]
      (when (contains? data :clojure.spec.alpha/problems)
        (if (string/ends-with? msg suffix)
          (subs msg 0 (- (count msg) (count suffix)))
          msg)))))

(defn root-cause
  "The innermost cause of `t`."
  [^Throwable t]
  (if-let [c (.getCause t)] (recur c) t))
