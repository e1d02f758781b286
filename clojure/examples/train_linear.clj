;; Data-parallel training through the store: a linear regression on synthetic
;; data, with four cpu contexts as workers, as clojure-mxnet trained on several
;; devices. The same demo in Rust is kvstore-jni/examples/train_linear.rs.
;;
;; Each step, every worker computes the gradient of the squared error on its
;; quarter of a minibatch (from its own copy of the weights), the four
;; gradients are pushed to one key (the store sums them), the store's optimizer
;; (SGD with momentum, rescale-gradient = 1 / batch size, so the sum becomes
;; the mean) updates the weights, and every worker pulls them back. The loss
;; over the whole data set falls to the noise floor (the noise variance), and
;; the learned weights land next to the true ones.
;;
;;   java -cp target/kvstore.jar:/usr/share/java/clojure.jar:/usr/share/java/spec.alpha.jar:/usr/share/java/core.specs.alpha.jar \
;;        clojure.main clojure/examples/train_linear.clj

(load-file (str (.getParent (java.io.File. ^String *file*)) "/linear.clj"))

(ns examples.train-linear
  (:require [examples.linear :refer [features params samples batch epochs noise-sd
                                     loss gradient print-params]]
            [org.apache.clojure-mxnet.context :as context]
            [org.apache.clojure-mxnet.kvstore :as kvstore]
            [org.apache.clojure-mxnet.ndarray :as ndarray]
            [org.apache.clojure-mxnet.optimizer :as optimizer]))

(set! *warn-on-reflection* true)

(def workers 4)

;;; Training

(def devs (mapv context/cpu (range workers)))
(def weights (mapv #(ndarray/zeros [params] {:ctx %}) devs))   ; each worker's copy
(def kv (kvstore/create "local"))

(-> kv
    (kvstore/init "w" (ndarray/zeros [params]))
    (kvstore/set-optimizer (optimizer/sgd {:learning-rate 0.05
                                           :momentum 0.9
                                           :wd 0.0
                                           :rescale-gradient (/ 1.0 batch)})))

(println (format "linear regression: %d samples, %d features, noise sd %s (loss floor %.4f); %d workers on cpu(0..%d)"
                 samples features noise-sd (* noise-sd noise-sd) workers (dec workers)))
(println (str "optimizer: " (kvstore/optimizer-name kv) ", learning-rate 0.05, momentum 0.9, rescale-gradient 1/" batch))

(defn params-of
  "The parameters in the NDArray `w`, as doubles."
  ^doubles [w]
  (double-array (ndarray/->double-vec w)))

(def quarter (quot batch workers))

(println (format "epoch %2d  loss %.6f" 0 (loss (params-of (first weights)))))
(doseq [epoch (range 1 (inc epochs))]
  (doseq [start (range 0 samples batch)]
    ;; The workers compute their gradients at the same time, each on its own device.
    (let [grads (->> (range workers)
                     (mapv (fn [k]
                             (future
                               (let [from (+ start (* k quarter))]
                                 (ndarray/array (gradient (params-of (weights k)) from (+ from quarter))
                                                [params]
                                                {:ctx (devs k)})))))
                     (mapv deref))]
      (-> kv
          (kvstore/push (vec (repeat workers "w")) grads)
          (kvstore/pull "w" weights))))
  (println (format "epoch %2d  loss %.6f" epoch (loss (params-of (first weights))))))

(print-params "" (ndarray/->double-vec (first weights)))

(shutdown-agents)
