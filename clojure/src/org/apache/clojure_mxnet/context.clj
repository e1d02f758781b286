(ns org.apache.clojure-mxnet.context
  "Devices, as in clojure-mxnet's `org.apache.clojure-mxnet.context`.

  A context is an `io.github.kvstore.Context`: `(cpu)`, `(cpu 1)`, `(gpu)`,
  `(gpu 0)`. CPU ids are logical devices in host memory (MXNet's `cpu(i)`), so
  `(cpu 3)` works on any machine. A GPU context can be created on any machine;
  using it where no GPU is available fails with
  `{:kvstore/error :device-unavailable}`."
  (:require [clojure.spec.alpha :as s]
            [org.apache.clojure-mxnet.util :as util])
  (:import (io.github.kvstore Context)))

(set! *warn-on-reflection* true)

(s/def ::device-id (s/and nat-int? util/int-value?))
(s/def ::context #(instance? Context %))

(defn cpu
  "The CPU context `device-id` (default 0)."
  (^Context [device-id]
   (util/validate! ::device-id device-id "Invalid device id")
   (util/with-kvstore-errors :cpu
     (Context/cpu (int device-id))))
  (^Context []
   (cpu 0)))

(defn gpu
  "The GPU context `device-id` (default 0)."
  (^Context [device-id]
   (util/validate! ::device-id device-id "Invalid device id")
   (util/with-kvstore-errors :gpu
     (Context/gpu (int device-id))))
  (^Context []
   (gpu 0)))

(defn cpu-context
  "The CPU context 0, as in clojure-mxnet."
  ^Context []
  (cpu))

(defn default-context
  "The context arrays are created in when none is given: `(cpu 0)`."
  ^Context []
  (util/with-kvstore-errors :default-context
    (Context/defaultContext)))

(defn device-type
  "\"cpu\" or \"gpu\"."
  [^Context context]
  (util/validate! ::context context "Invalid context")
  (.deviceType context))

(defn device-id
  "The device number of `context`."
  [^Context context]
  (util/validate! ::context context "Invalid context")
  (.deviceId context))

(defn context?
  "True if `x` is a context."
  [x]
  (instance? Context x))

(defn ->context
  "Coerces `x` to a context: a context is returned as is, nil is the default
  context, a string such as \"cpu(1)\" or \"gpu\" (printed form), a keyword
  `:cpu`/`:gpu`, or a vector `[:gpu 1]` is parsed. Anything else is an
  `ex-info` with `{:kvstore/error :invalid-argument}`."
  ^Context [x]
  (let [bad #(util/invalid-argument! (str "Invalid context: " (pr-str x))
                                     {:kvstore/op :context :context x})
        make (fn [t id]
               (case t
                 "cpu" (cpu id)
                 "gpu" (gpu id)
                 (bad)))]
    (cond
      (instance? Context x) x
      (nil? x) (default-context)
      (keyword? x) (make (name x) 0)
      (and (vector? x) (= 2 (count x)) (keyword? (first x)) (nat-int? (second x)))
      (make (name (first x)) (second x))
      (string? x)
      (if-let [[_ t id] (re-matches #"\s*(cpu|gpu)\s*(?:\(\s*(\d{1,10})\s*\))?\s*" x)]
        (make t (if id (Long/parseLong id) 0))
        (bad))
      :else (bad))))
