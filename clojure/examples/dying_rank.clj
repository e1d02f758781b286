;; A rank of a dist_sync job that fails mid-job (kvstore-mpi/tests/jvm.rs runs it
;; under mpirun -np 2): rank 1 throws before its push, so rank 0 waits in its
;; push for a worker that is gone. The JVM of rank 1 exits without
;; finalize-mpi, which aborts the MPI job: mpirun ends both ranks within
;; seconds, with a failing exit status, and rank 0's push never returns.

(require '[org.apache.clojure-mxnet.kvstore :as kvstore]
         '[org.apache.clojure-mxnet.ndarray :as ndarray])

(def kv (kvstore/create "dist_sync"))
(kvstore/init kv "w" (ndarray/zeros [4]))
(when (= 1 (kvstore/rank kv))
  (throw (ex-info "rank 1 fails before its push" {:rank 1})))
(kvstore/push kv "w" (ndarray/ones [4]))
(println "push returned on rank" (kvstore/rank kv))
(kvstore/finalize-mpi)
