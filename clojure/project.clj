;; Leiningen project for working on the Clojure namespaces of kvstore in this
;; repository (clojure-mxnet's kvstore, ndarray and context over the kvstore
;; jar). To use kvstore from a project of your own, run `make install` and
;; depend on [io.github.kvstore/kvstore "0.1.0"]: see the README, "In your own
;; project: Leiningen".
;;
;; Here the jar is built with `make jar` at the repository root; it is put on the classpath from
;; ../target/kvstore.jar. The namespaces come from src/ (ahead of the copies
;; inside the jar).
;;
;;   lein repl                          ; with Maven Central / Clojars
;;   lein test
;;   lein with-profile +debian repl     ; offline, from Debian's maven repo
;;   lein with-profile +debian test     ; (apt-get install leiningen clojure libtest-check-clojure)
(defproject io.github.kvstore/kvstore-clojure "0.1.0-SNAPSHOT"
  :description "Apache MXNet's KVStore rebuilt in Rust: clojure-mxnet's kvstore, ndarray and context namespaces"
  :license {:name "Apache-2.0" :url "https://www.apache.org/licenses/LICENSE-2.0"}
  :dependencies [[org.clojure/clojure "1.11.1"]]
  :source-paths ["src"]
  :test-paths ["test"]
  :resource-paths ["../target/kvstore.jar"]
  :profiles {:dev {:dependencies [[org.clojure/test.check "1.1.0"]]}
             ;; Resolves everything from the machine's Debian maven repository
             ;; (/usr/share/maven-repo), with no network.
             :debian {:local-repo "target/m2"
                      :repositories ^:replace [["debian" {:url "file:///usr/share/maven-repo"
                                                          :checksum :ignore
                                                          :snapshots false}]]}})
