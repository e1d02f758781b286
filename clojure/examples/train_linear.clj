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

(ns examples.train-linear
  (:require [org.apache.clojure-mxnet.context :as context]
            [org.apache.clojure-mxnet.kvstore :as kvstore]
            [org.apache.clojure-mxnet.ndarray :as ndarray]
            [org.apache.clojure-mxnet.optimizer :as optimizer]))

(set! *warn-on-reflection* true)

(def features 8)
(def params (inc features))          ; the key "w" holds [w0 .. w7 b]
(def samples 4096)
(def batch 256)
(def workers 4)
(def epochs 10)
(def noise-sd 0.1)
(def w-true [1.5 -2.0 0.7 3.1 -0.4 0.0 2.2 -1.3])
(def b-true 0.5)

;;; The data: x row-major (samples x features), y = x.w + b + noise, fixed seed.

(defn- predict ^double [^doubles x ^long row ^doubles p]
  (loop [j 0 acc (aget p features)]
    (if (== j features)
      acc
      (recur (inc j) (+ acc (* (aget x (+ (* row features) j)) (aget p j)))))))

(def data
  (let [rng (java.util.Random. 42)
        x (double-array (repeatedly (* samples features) #(.nextGaussian rng)))
        truth (double-array (conj w-true b-true))
        y (double-array (for [i (range samples)]
                          (+ (predict x i truth) (* noise-sd (.nextGaussian rng)))))]
    {:x x :y y}))

(defn loss
  "The mean squared error of the parameters `p` over the whole data set."
  ^double [^doubles p]
  (let [^doubles x (:x data) ^doubles y (:y data)]
    (/ (loop [i 0 acc 0.0]
         (if (== i samples)
           acc
           (let [e (- (predict x i p) (aget y i))]
             (recur (inc i) (+ acc (* e e))))))
       samples)))

(defn gradient
  "The gradient of the squared error summed over the samples [from, to):
  sum of 2 (x.w + b - y) [x 1]."
  [^doubles p ^long from ^long to]
  (let [^doubles x (:x data) ^doubles y (:y data)
        g (double-array params)]
    (doseq [i (range from to)]
      (let [err (* 2.0 (- (predict x i p) (aget y i)))]
        (dotimes [j features]
          (aset g j (+ (aget g j) (* err (aget x (+ (* i features) j))))))
        (aset g features (+ (aget g features) err))))
    (vec g)))

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

(println "param    learned      true")
(doseq [[j learned truth] (map vector (range) (ndarray/->double-vec (first weights)) (conj w-true b-true))]
  (println (format "%-6s %9.4f %9.4f" (if (< j features) (str "w[" j "]") "b") learned (double truth))))

(shutdown-agents)
