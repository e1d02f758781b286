;; The Clojure row of `make bench`: push+pull of a 1 Ki-f32 key through the
;; org.apache.clojure-mxnet.kvstore namespace, written as JSON for the Rust report to
;; hold against the same operation from Rust in the same run.
;; Usage: java -cp kvstore.jar:<clojure jars> clojure.main clojure/bench/kvstore_bench.clj OUT.json
(ns kvstore-bench
  (:require [org.apache.clojure-mxnet.kvstore :as kvstore]
            [org.apache.clojure-mxnet.ndarray :as ndarray]))

(set! *warn-on-reflection* true)

(defn- median-per-call
  "Median seconds per call of f over `runs` timings of `reps` calls, after a warm-up."
  [runs reps f]
  (dotimes [_ reps] (f))
  (let [ts (sort (for [_ (range runs)]
                   (let [start (System/nanoTime)]
                     (dotimes [_ reps] (f))
                     (/ (- (System/nanoTime) start) 1e9 reps))))]
    (nth ts (quot runs 2))))

(let [out-file (first *command-line-args*)
      runs (Integer/getInteger "kvstore.bench.runs" 21)
      kv (kvstore/create "local")
      small (ndarray/ones [1024])
      small-out (ndarray/zeros [1024])]
  (kvstore/init kv "s" small)
  (let [t (median-per-call runs 20000 #(-> kv (kvstore/push "s" small) (kvstore/pull "s" small-out)))]
    (spit out-file (format "[\n{\"name\": \"clojure: push+pull 1 Ki f32\", \"median_s\": %.9e}\n]\n" t)))
  (kvstore/dispose kv))
