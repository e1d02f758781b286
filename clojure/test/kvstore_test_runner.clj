(ns kvstore-test-runner
  "Runs the Clojure test namespaces and ends with one line
  `clojure: N passed, N failed`, or, with `-Dkvstore.junit.xml=FILE`, writes the
  results to FILE as a JUnit XML report instead (scripts/junit.py totals
  it).

  It counts deftests (a test.check `defspec` is a deftest too), not
  assertions: a deftest passes when it made at least one assertion and none of
  them failed or threw. A deftest with a failed or erroring assertion, or with
  no assertion at all (a test that asserts nothing is a defect), is failed. A
  namespace that does not load, and an error reported outside any deftest,
  count as one failed test each; so do reflection warnings printed while the
  namespaces load (all of them together count as one).

  The namespaces are the `*_test.clj` files found beside this file (when it is
  a file on disk), else `default-namespaces`; arguments, when given, name the
  namespaces to run instead.

  Exits 0 only when nothing failed and at least one test ran; calls
  `shutdown-agents` first.

      java -cp target/kvstore.jar:clojure/test:<clojure jars> clojure.main -m kvstore-test-runner"
  (:require [clojure.java.io :as io]
            [clojure.string :as string]
            [clojure.test :as t])
  (:import (java.io File)))

(set! *warn-on-reflection* true)

(def default-namespaces
  '[org.apache.clojure-mxnet.async-test
    org.apache.clojure-mxnet.context-test
    org.apache.clojure-mxnet.ndarray-test
    org.apache.clojure-mxnet.hardening-test
    org.apache.clojure-mxnet.kvstore-test
    org.apache.clojure-mxnet.optimizer-test
    org.apache.clojure-mxnet.sparse-test
    org.apache.clojure-mxnet.util-test])

(defn- file->ns
  "The namespace symbol of the source file `f` under the folder `root`."
  [^File root ^File f]
  (-> (.relativize (.toPath root) (.toPath f))
      str
      (string/replace #"\.clj$" "")
      (string/replace File/separator ".")
      (string/replace "_" "-")
      symbol))

(defn discover-namespaces
  "The test namespaces (`*_test.clj`) under the folder holding this file, or
  `default-namespaces` when this file is not on disk (e.g. in a jar)."
  []
  (let [url (io/resource "kvstore_test_runner.clj")]
    (if (and url (= "file" (.getProtocol ^java.net.URL url)))
      (let [root (.getParentFile (io/file url))
            found (->> (file-seq root)
                       (filter (fn [^File f]
                                 (and (.isFile f) (string/ends-with? (.getName f) "_test.clj"))))
                       (map #(file->ns root %))
                       sort
                       vec)]
        (if (seq found) found default-namespaces))
      default-namespaces)))

(defn- counting-report
  "A `clojure.test/report` that records each assertion's outcome under the
  deftest running it in `state`, then hands the event to `original` (which
  prints failures), except the summary, which this runner prints itself."
  [original state]
  (fn [m]
    (case (:type m)
      :begin-test-var (swap! state (fn [s]
                                     (-> s
                                         (assoc :current (:var m))
                                         (update-in [:tests (:var m)] #(or % {:pass 0 :fail 0 :error 0})))))
      :end-test-var (swap! state assoc :current nil)
      (:pass :fail :error) (swap! state (fn [s]
                                          (if-let [v (:current s)]
                                            (update-in s [:tests v (:type m)] inc)
                                            (update s :outside inc))))
      nil)
    (when-not (= :summary (:type m))
      (original m))))

(defn run
  "Runs the tests of `namespaces`; returns `{:passed n :failed n :failures
  [description ...]}`."
  [namespaces]
  (let [state (atom {:current nil :tests {} :outside 0})
        load-failures (atom [])
        original t/report]
    ;; Load first, outside the binding: test.check installs its report methods
    ;; on the clojure.test/report multimethod when it loads. The compiler's
    ;; warnings are captured to count reflection warnings (every namespace sets
    ;; *warn-on-reflection*), and still shown.
    (let [captured (java.io.StringWriter.)]
      (binding [*err* (java.io.PrintWriter. captured true)]
        (doseq [ns-sym namespaces]
          (try
            (require ns-sym)
            (catch Throwable e
              (println "ERROR loading" ns-sym ":" (str e))
              (.printStackTrace e)
              (swap! load-failures conj (str ns-sym " (did not load: " (.getMessage e) ")"))))))
      (let [text (str captured)
            reflection (filter #(string/starts-with? % "Reflection warning") (string/split-lines text))]
        (binding [*out* *err*] (print text) (flush))
        (when (seq reflection)
          (swap! load-failures conj (str (count reflection) " reflection warning(s) while loading")))))
    (binding [t/report (counting-report original state)]
      (doseq [ns-sym namespaces
              :when (find-ns ns-sym)]
        (try
          (t/run-tests ns-sym)
          (catch Throwable e
            (println "ERROR running" ns-sym ":" (str e))
            (.printStackTrace e)
            (swap! load-failures conj (str ns-sym " (did not run: " (.getMessage e) ")"))))))
    (let [{:keys [tests outside]} @state
          why (fn [{:keys [pass fail error]}]
                (cond
                  (pos? error) (str error " error(s), " fail " failure(s)")
                  (pos? fail) (str fail " failure(s)")
                  (zero? pass) "no assertion"))
          cases (for [[v counts] (sort-by (comp str symbol key) tests)]
                  {:ns (str (:ns (meta v))) :name (str (:name (meta v))) :failure (why counts)})
          failed-tests (for [{:keys [ns name failure]} cases :when failure]
                         (str ns "/" name " (" failure ")"))
          others (concat @load-failures
                         (when (pos? outside)
                           [(str outside " failure(s) outside any deftest")]))]
      {:passed (count (remove :failure cases))
       :failed (+ (count failed-tests) (count others))
       :failures (vec (concat others failed-tests))
       :cases (vec (concat cases
                           (for [o others] {:ns "kvstore-test-runner" :name o :failure o})))})))

(defn- xml-attr
  "`s` quoted for an XML attribute."
  [s]
  (str "\"" (string/escape (str s) {\& "&amp;" \< "&lt;" \> "&gt;" \" "&quot;" \' "&apos;"}) "\""))

(defn write-junit-xml
  "Writes `cases` (`{:ns :name :failure}`, `:failure` nil for a pass) to the file
  `path` as a JUnit XML report: one testcase per deftest, and one failed testcase
  per failure outside the deftests (a namespace that did not load, ...)."
  [path cases]
  (with-open [w (io/writer path)]
    (.write w (str "<testsuite name=\"clojure\" tests=" (xml-attr (count cases)) ">\n"))
    (doseq [{:keys [ns name failure]} cases]
      (.write w (str "  <testcase classname=" (xml-attr ns) " name=" (xml-attr name) ">"
                     (when failure (str "<failure message=" (xml-attr failure) "/>"))
                     "</testcase>\n")))
    (.write w "</testsuite>\n")))

(defn -main
  "Runs the test namespaces named by `args` (all of them when none), prints
  `clojure: N passed, N failed` (or writes the JUnit XML report that the system
  property `kvstore.junit.xml` names) and exits."
  [& args]
  (let [namespaces (if (seq args) (mapv symbol args) (discover-namespaces))
        {:keys [passed failed failures cases]} (run namespaces)
        xml (System/getProperty "kvstore.junit.xml")]
    (println)
    (doseq [f failures]
      (println "FAILED:" f))
    (if xml
      (do (write-junit-xml xml cases)
          (println (str "kvstore-test-runner: wrote " xml)))
      (println (str "clojure: " passed " passed, " failed " failed")))
    (flush)
    (shutdown-agents)
    (System/exit (if (and (zero? failed) (pos? passed)) 0 1))))
