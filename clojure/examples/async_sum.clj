;; A dist_async job from Clojure (kvstore-mpi/tests/jvm.rs runs it under mpirun -np 2,
;; with the kvstore-mpi jar): a Clojure updater that adds each push runs on each key's
;; owner; both ranks push (blocking, and non-blocking), then meet at a barrier, and
;; every rank must pull the initial value plus every push of every rank. Each rank
;; prints `rank R: sum S` and `rank R: big S` (a key split across the owners).

(require '[org.apache.clojure-mxnet.kvstore :as kvstore]
         '[org.apache.clojure-mxnet.ndarray :as ndarray])

(def kv (kvstore/create "dist_async"))
(def rank (kvstore/rank kv))
(kvstore/init kv ["s" "big"] [(ndarray/zeros [4]) (ndarray/zeros [1000001])])
(kvstore/set-updater kv (fn [_ input stored] (ndarray/+= stored input)))
(dotimes [step 10]
  (kvstore/push kv "s" (ndarray/full [4] (+ rank step)))
  (kvstore/push kv "big" (ndarray/ones [1000001])))
@(kvstore/push-async kv "s" (ndarray/full [4] 100))
(kvstore/barrier kv)
(println (str "rank " rank ": sum " (first (ndarray/->vec (kvstore/pull kv "s")))))
(println (str "rank " rank ": big " (first (ndarray/->vec (kvstore/pull kv "big")))))
(kvstore/finalize-mpi)
