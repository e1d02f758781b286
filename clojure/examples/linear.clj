;; The linear regression that train_linear.clj and dist_train.clj train: synthetic
;; data with a fixed seed, the model, its loss and its gradient, and the report.
;; Loaded by those scripts with `load-file`; it trains nothing by itself.

(ns examples.linear)

(set! *warn-on-reflection* true)

(def features 8)
(def params (inc features))          ; the key "w" holds [w0 .. w7 b]
(def samples 4096)
(def batch 256)
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

(defn print-params
  "Prints the table `param learned true` of the parameters `learned`, each line
  after `prefix`."
  [prefix learned]
  (println (str prefix "param    learned      true"))
  (doseq [[j l truth] (map vector (range) learned (conj w-true b-true))]
    (println (format "%s%-6s %9.4f %9.4f" prefix (if (< j features) (str "w[" j "]") "b") (double l) (double truth)))))
