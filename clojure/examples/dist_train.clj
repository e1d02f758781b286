;; Data-parallel training across processes: the linear regression of
;; train_linear.clj, trained by every rank of an MPI job through one
;; "dist_sync" store. Needs the jar with MPI support (make jar FEATURES=mpi):
;;
;;   mpirun -np 2 java -cp target/kvstore-mpi.jar:/usr/share/java/clojure.jar:/usr/share/java/spec.alpha.jar:/usr/share/java/core.specs.alpha.jar \
;;          clojure.main clojure/examples/dist_train.clj
;;
;; Checkpoints and restarts: with --checkpoint-dir DIR the job saves the whole
;; store (weights, momentum, the optimizer's progress) every 2 epochs, as
;; DIR/epoch-NN.ckpt (rank 0 writes; every rank returns once the file is on
;; disk). With --resume PATH it starts from that checkpoint (PATH a file, or a
;; folder: its latest checkpoint) at the epoch its name gives; on as many ranks
;; as saved it, the weights come out the same, to the last bit, as if the job had
;; never stopped; on fewer (or more) ranks it trains on. --epochs N stops after
;; epoch N (default 10). After a crash, run the same command with --resume DIR:
;;
;;   mpirun -np 2 java -cp ... clojure.main clojure/examples/dist_train.clj \
;;          --checkpoint-dir ckpt --resume ckpt
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
(def checkpoint-every 2)

(defn option
  "The value after `flag` on the command line, or nil."
  [flag]
  (second (drop-while #(not= flag %) *command-line-args*)))

(defn epoch-of
  "The epoch a checkpoint named epoch-NN.ckpt was saved after, or nil."
  [^java.io.File f]
  (some->> (.getName f) (re-matches #"epoch-(\d+)\.ckpt") second Long/parseLong))

(defn latest-checkpoint
  "The checkpoint file `path` names: itself, or the latest epoch-NN.ckpt in
  the folder `path`."
  ^java.io.File [path]
  (let [f (java.io.File. ^String path)]
    (cond
      (.isDirectory f) (or (->> (.listFiles f) (filter epoch-of) (sort-by epoch-of) last)
                           (throw (ex-info (str "no epoch-NN.ckpt checkpoint in " path) {:path path})))
      (.exists f) f
      :else (throw (ex-info (str "no checkpoint at " path) {:path path})))))

(def checkpoint-dir (option "--checkpoint-dir"))
(def resume-from (some-> (option "--resume") latest-checkpoint))
(def last-epoch (if-let [n (option "--epochs")] (Long/parseLong n) epochs))

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

;; Resuming: the checkpoint replaces the store's weights, optimizer and
;; momentum (every rank loads the same file, or every rank fails); each context
;; then pulls the weights it computes its next gradient from.
(def first-epoch
  (if resume-from
    (let [epoch (or (epoch-of resume-from)
                    (throw (ex-info (str resume-from ": not an epoch-NN.ckpt checkpoint") {})))]
      (kvstore/load-checkpoint kv (str resume-from))
      (kvstore/pull kv "w" weights)
      (println (format "%sresumed from %s at epoch %d on %d ranks" prefix resume-from epoch ranks))
      (inc epoch))
    1))

(when checkpoint-dir
  (.mkdirs (java.io.File. ^String checkpoint-dir)))

(defn params-of
  "The parameters in the NDArray `w`, as doubles."
  ^doubles [w]
  (double-array (ndarray/->double-vec w)))

(when (zero? rank)
  (println (format "linear regression: %d samples, %d features, noise sd %s (loss floor %.4f)"
                   samples features noise-sd (* noise-sd noise-sd)))
  (println (format "dist_sync over %d ranks x %d cpu contexts; optimizer %s, learning-rate 0.05, momentum 0.9"
                   ranks local-workers (kvstore/optimizer-name kv))))

(println (format "%sepoch %2d  loss %.6f" prefix (dec first-epoch) (loss (params-of (first weights)))))
(doseq [epoch (range first-epoch (inc last-epoch))]
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
  (println (format "%sepoch %2d  loss %.6f" prefix epoch (loss (params-of (first weights)))))
  (when (and checkpoint-dir (zero? (mod epoch checkpoint-every)))
    (let [f (str (java.io.File. ^String checkpoint-dir (format "epoch-%02d.ckpt" epoch)))]
      (kvstore/save-checkpoint kv f)
      (when (zero? rank) (println (str "checkpoint " f))))))

(print-params prefix (ndarray/->double-vec (first weights)))
;; The exact bits, so that a check can compare the ranks without rounding.
(println (str prefix "bits " (clojure.string/join " " (map #(Long/toHexString (Double/doubleToLongBits %))
                                                           (ndarray/->double-vec (first weights))))))

;; A non-blocking push of a small key: dist_sync holds it back to fuse with the calls
;; after it, and deref releases it, so the wait never waits for a later call.
(kvstore/init kv "fused" (ndarray/zeros [4]))
(when (= ::timeout (deref (kvstore/push-async kv "fused" (ndarray/ones [4])) 60000 ::timeout))
  (throw (ex-info "a held push-async did not finish within 60 s of its deref" {})))

(kvstore/barrier kv)
(kvstore/finalize-mpi)
(shutdown-agents)
