;; A call that one rank of a dist_sync job refuses before it reaches the store
;; (kvstore-mpi/tests/jvm.rs runs it under mpirun -np 2; any number of ranks
;; works): rank 1 gives a disposed array to each form of call, the others a
;; live one. Every such call must fail on every rank as that call's refusal
;; (:disposed on rank 1, on the others an :invalid-argument saying that rank 1
;; refused it), change nothing, and leave the ranks' next calls matched: the
;; calls in between succeed on every rank, and all end with the same values.
;; Then a row-sparse table split across the ranks' owners takes every rank's
;; rows, gives them back to a pull of rows, and refuses a dense push everywhere.
;; Each rank prints `rank R: ok` when all of this held, else what did not, and
;; exits non-zero.

(require '[clojure.string :as string]
         '[org.apache.clojure-mxnet.kvstore :as kvstore]
         '[org.apache.clojure-mxnet.ndarray :as ndarray]
         '[org.apache.clojure-mxnet.sparse :as sparse])

(def kv (kvstore/create "dist_sync"))
(def rank (kvstore/rank kv))
(def problems (atom []))

(defn- outcome
  "What calling `f` did: :ok, or the ex-info's :kvstore/error and message."
  [f]
  (try (f) [:ok]
       (catch clojure.lang.ExceptionInfo e
         [(:kvstore/error (ex-data e)) (ex-message e)])))

(defn- gone
  "An array of shape [2]: disposed on rank 1, live (ones) on the others."
  []
  (let [a (ndarray/ones [2])]
    (when (= 1 rank) (ndarray/dispose a))
    a))

(defn- refused!
  "Calls `f` (given this rank's array from `gone`) and records a problem unless
  it failed as rank 1's refusal."
  [what f]
  (let [[error message] (outcome #(f (gone)))
        expected (if (= 1 rank) :disposed :invalid-argument)]
    (when-not (and (= expected error)
                   (or (= 1 rank) (string/includes? (str message) "rank 1 refused")))
      (swap! problems conj (str what ": " error " " message)))))

(defn- succeeds!
  "Calls `f` and records a problem unless it succeeded."
  [what f]
  (let [[error message] (outcome f)]
    (when-not (= :ok error)
      (swap! problems conj (str what " after a refusal: " error " " message)))))

(kvstore/init kv "w" (ndarray/zeros [2]))
(refused! "push" #(kvstore/push kv "w" %))
(succeeds! "push" #(kvstore/push kv "w" (ndarray/ones [2])))
(refused! "pushpull into a disposed out" #(kvstore/pushpull kv "w" (ndarray/ones [2]) %))
(succeeds! "pushpull" #(kvstore/pushpull kv "w" (ndarray/ones [2]) (ndarray/zeros [2])))
(refused! "init" #(kvstore/init kv "x" %))
(refused! "broadcast" #(kvstore/broadcast kv "y" % (ndarray/zeros [2])))
(succeeds! "init" #(kvstore/init kv "x" (ndarray/ones [2])))
(refused! "push-async" #(deref (kvstore/push-async kv "w" %)))
(succeeds! "push-async" #(deref (kvstore/push-async kv "w" (ndarray/ones [2]))))
(refused! "pushpull-async" #(deref (kvstore/pushpull-async kv "w" %)))
(kvstore/init kv "e" (ndarray/zeros [3 2]))
(let [rows (sparse/row-sparse-array (ndarray/ones [1 2]) [1] [3 2])]
  (when (= 1 rank) (.close ^java.lang.AutoCloseable rows))
  (refused! "push of a row-sparse value whose data was closed" (fn [_] (kvstore/push kv "e" rows))))
;; Row-sparse values rank 1 cannot pair with its keys (two keys, one value):
;; refused in the natives before the store sees them, the push fails on every rank.
(let [rows (sparse/row-sparse-array (ndarray/ones [1 2]) [1] [3 2])
      [error message] (outcome #(if (= 1 rank)
                                  (kvstore/push kv ["e" "e"] [rows])
                                  (kvstore/push kv "e" rows)))]
  (when-not (if (= 1 rank)
              (= :length-mismatch error)
              (and (= :invalid-argument error) (string/includes? (str message) "rank 1 refused")))
    (swap! problems conj (str "row-sparse push of values without keys: " error " " message))))
(succeeds! "row-sparse push" #(kvstore/push kv "e" (sparse/row-sparse-array (ndarray/ones [1 2]) [1] [3 2])))
;; A row-sparse table, split across the ranks' owners (1.2 M elements, over the
;; bound): every rank's rows reach their owners, a pull of rows asks them, and a
;; dense push into it is refused on every rank.
(kvstore/init kv "t" (sparse/zeros [300000 4]))
(let [n (kvstore/num-workers kv)
      mine [rank (- 299999 rank)]]
  (succeeds! "row-sparse push into a table"
             #(kvstore/push kv "t" (sparse/row-sparse-array (ndarray/ones [2 4]) mine [300000 4])))
  (let [ids (vec (concat (range n) (range (- 300000 n) 300000)))
        rows (kvstore/row-sparse-pull kv "t" ids)]
    (when-not (and (= ids (vec (sparse/indices rows)))
                   (= (repeat (* 4 (count ids)) 1.0) (ndarray/->vec (sparse/data rows))))
      (swap! problems conj (str "the table's rows are " (sparse/indices rows) " " (ndarray/->vec (sparse/data rows))))))
  (let [[error _] (outcome #(kvstore/push kv "t" (ndarray/ones [300000 4])))]
    (when-not (= :unsupported error)
      (swap! problems conj (str "a dense push into the table: " error)))))
(succeeds! "barrier" #(kvstore/barrier kv))
;; Every successful push summed one array per rank: the values are the number of
;; ranks, on every rank.
(let [w (ndarray/->vec (kvstore/pull kv "w"))
      n (double (kvstore/num-workers kv))
      ks (kvstore/keys kv)]
  (when-not (= [n n] w)
    (swap! problems conj (str "w is " w ", not " [n n])))
  (when-not (= ["w" "x" "e" "t"] ks)
    (swap! problems conj (str "the keys are " ks ", not [\"w\" \"x\" \"e\" \"t\"]"))))
(kvstore/finalize-mpi)
(if (empty? @problems)
  (println (str "rank " rank ": ok"))
  (do
    (doseq [p @problems]
      (println (str "rank " rank ": FAILED " p)))
    (System/exit 1)))
