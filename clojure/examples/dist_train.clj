;; Data-parallel training across processes: the linear regression of
;; train_linear.clj, trained by every rank of an MPI job through one
;; "dist_sync" store. Needs the jar with MPI support (make jar FEATURES=mpi):
;;
;;   mpirun -np 2 java -cp target/kvstore-mpi.jar:/usr/share/java/clojure.jar:/usr/share/java/spec.alpha.jar:/usr/share/java/core.specs.alpha.jar \
;;          clojure.main clojure/examples/dist_train.clj
;;
;; Each minibatch is split between the ranks, and each rank splits its share
;; between two cpu contexts. Every step, each context computes the gradient
;; of its samples from its own copy of the weights and pushes it to the key
;; "w": the store sums the two gradients of the rank, then sums those over the
;; ranks (MPI allreduce), and every rank runs the same optimizer step (SGD with
;; momentum, rescale-gradient = 1 / batch size) on the same sum, so the
;; replicas stay identical; each context pulls the new weights back. Every
;; rank prints its learned weights, prefixed by its rank: they are the same on
;; every rank, to the last bit.

(load-file (str (.getParent (java.io.File. ^String *file*)) "/linear.clj"))

(ns examples.dist-train
  (:require [examples.linear :refer [features params samples batch epochs noise-sd
                                     loss gradient print-params]]
            [org.apache.clojure-mxnet.context :as context]
            [org.apache.clojure-mxnet.kvstore :as kvstore]
            [org.apache.clojure-mxnet.ndarray :as ndarray]
            [org.apache.clojure-mxnet.optimizer :as optimizer]))

(set! *warn-on-reflection* true)

(def local-workers 2)

(def kv (kvstore/create "dist_sync"))
(def rank (kvstore/rank kv))
(def ranks (kvstore/num-workers kv))
(def prefix (format "rank %d: " rank))

(when-not (zero? (mod batch (* ranks local-workers)))
  (throw (ex-info (format "the batch of %d does not split over %d ranks x %d contexts" batch ranks local-workers)
                  {:batch batch :ranks ranks})))

(def devs (mapv context/cpu (range local-workers)))
(def weights (mapv #(ndarray/zeros [params] {:ctx %}) devs))   ; each context's copy
(def share (quot batch (* ranks local-workers)))                 ; samples per context per step

;; init takes rank 0's value on every rank (here zeros everywhere anyway).
(-> kv
    (kvstore/init "w" (ndarray/zeros [params]))
    (kvstore/set-optimizer (optimizer/sgd {:learning-rate 0.05
                                           :momentum 0.9
                                           :wd 0.0
                                           :rescale-gradient (/ 1.0 batch)})))

(defn params-of
  "The parameters in the NDArray `w`, as doubles."
  ^doubles [w]
  (double-array (ndarray/->double-vec w)))

(when (zero? rank)
  (println (format "linear regression: %d samples, %d features, noise sd %s (loss floor %.4f)"
                   samples features noise-sd (* noise-sd noise-sd)))
  (println (format "dist_sync over %d ranks x %d cpu contexts; optimizer %s, learning-rate 0.05, momentum 0.9"
                   ranks local-workers (kvstore/optimizer-name kv))))

(println (format "%sepoch %2d  loss %.6f" prefix 0 (loss (params-of (first weights)))))
(doseq [epoch (range 1 (inc epochs))]
  (doseq [start (range 0 samples batch)]
    (let [grads (->> (range local-workers)
                     (mapv (fn [k]
                             (future
                               (let [from (+ start (* (+ (* rank local-workers) k) share))]
                                 (ndarray/array (gradient (params-of (weights k)) from (+ from share))
                                                [params]
                                                {:ctx (devs k)})))))
                     (mapv deref))]
      (-> kv
          (kvstore/push (vec (repeat local-workers "w")) grads)
          (kvstore/pull "w" weights))))
  (println (format "%sepoch %2d  loss %.6f" prefix epoch (loss (params-of (first weights))))))

(print-params prefix (ndarray/->double-vec (first weights)))
;; The exact bits, so that a check can compare the ranks without rounding.
(println (str prefix "bits " (clojure.string/join " " (map #(Long/toHexString (Double/doubleToLongBits %))
                                                           (ndarray/->double-vec (first weights))))))

(kvstore/barrier kv)
(kvstore/finalize-mpi)
(shutdown-agents)
