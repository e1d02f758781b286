#!/usr/bin/env bash
# Proves that clojure/project.clj and clojure/deps.edn work for users, offline,
# with Debian's tools and Debian's maven repository (/usr/share/maven-repo):
#  - lein with-profile +debian run: requires the namespaces, pushes and pulls a key;
#  - lein with-profile +debian test: the test suite through Leiningen;
#  - deps.edn: the classpath resolved by Debian's tools.deps (its API, as the
#    Clojure CLI would), then the same check with that classpath;
#  - deps.edn's :test alias: the test suite on the resolved classpath.
# Each check is a test case in ${KVSTORE_REPORTS:-target/test-reports/clojure-tools}; ends
# with one line `clojure-tools: N passed, N failed`; exits non-zero on failure.
#
# Needs target/kvstore.jar (make jar). Installs Debian's leiningen and
# libtools-deps-clojure when missing and apt-get can.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/suite.sh
suite_init clojure-tools

if ! command -v lein >/dev/null || [ ! -f /usr/share/java/tools.deps.jar ] || [ ! -f /usr/share/java/test.check.jar ]; then
    bash scripts/apt-install.sh leiningen libtools-deps-clojure libtest-check-clojure clojure \
        >"$logs/clojure-tools-apt.log" 2>&1
fi
[ -f "$root/target/kvstore.jar" ] || give_up "target/kvstore.jar (make jar)"

cd clojure
# Leiningen and the checks below write clojure/target (the :debian profile's
# local repository target/m2 among them) and clojure/.lein-failures: remove
# them afterwards unless they were there before.
[ -e target ] && had_target=1 || had_target=0
[ -e .lein-failures ] && had_lein_failures=1 || had_lein_failures=0

# The check: the three namespaces load, a key is pushed from two devices and pulled.
form='(do (require (quote [org.apache.clojure-mxnet.kvstore :as kvstore])
                   (quote [org.apache.clojure-mxnet.ndarray :as ndarray])
                   (quote [org.apache.clojure-mxnet.context :as context]))
          (let [out (ndarray/zeros [2 3])]
            (-> (kvstore/create "local")
                (kvstore/init "w" (ndarray/ones [2 3]))
                (kvstore/push "w" [(ndarray/ones [2 3] {:ctx (context/cpu 0)})
                                   (ndarray/ones [2 3] {:ctx (context/cpu 1)})])
                (kvstore/pull "w" out))
            (println "smoke:" (ndarray/->vec out))))'
expected='smoke: [2.0 2.0 2.0 2.0 2.0 2.0]'

# Every lein and java run is limited (generously): a hang fails its check
# instead of stalling the script. timeout exits 124 (137 after its KILL).
limit=300

# smoke WANT COMMAND...: COMMAND exits with 0 within $limit seconds and, unless WANT is
# empty, printed the line WANT (for `check`).
smoke() {
    local want=$1 out status
    shift
    out=$(timeout -k 10 "$limit" "$@" 2>&1)
    status=$?
    printf '%s\n' "$out"
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then echo "(did not finish within $limit s)"; fi
    [ "$status" -eq 0 ] && { [ -z "$want" ] || grep -qxF -- "$want" <<<"$out"; }
}

if command -v lein >/dev/null; then
    # Leiningen leaves a form-init*.clj per run in java.io.tmpdir: keep them in target/.
    mkdir -p target/java-tmp
    export LEIN_JVM_OPTS="-XX:+TieredCompilation -XX:TieredStopAtLevel=1 -Djava.io.tmpdir=$(pwd)/target/java-tmp"
    check lein-run smoke "$expected" \
        lein with-profile +debian run -m clojure.main -e "$form"
    check lein-test smoke "" \
        lein with-profile +debian test
else
    echo "lein not found (apt-get install leiningen)"
    record lein-run "lein not found"
    record lein-test "lein not found"
fi

if [ -f /usr/share/java/tools.deps.jar ]; then
    # Resolve deps.edn's classpath (with and without the :test alias) through
    # tools.deps, into a local repository under target/.
    resolve() {
        local aliases=$1 out=$2
        timeout -k 10 "$limit" java -cp /usr/share/java/tools.deps.jar clojure.main -e "
          (require 'clojure.tools.deps)
          (let [basis (clojure.tools.deps/create-basis
                        {:user nil :project \"deps.edn\" :aliases $aliases
                         :extra {:mvn/local-repo \"target/m2\"}})]
            (spit \"$out\" (clojure.tools.deps/join-classpath (:classpath-roots basis))))"
    }
    cp_file=$(mktemp)
    test_cp_file=$(mktemp)
    if resolve "[]" "$cp_file" >"$logs/clojure-deps-resolve.log" 2>&1 &&
        resolve "[:test]" "$test_cp_file" >>"$logs/clojure-deps-resolve.log" 2>&1; then
        check deps-run smoke "$expected" \
            java -cp "$(cat "$cp_file")" clojure.main -e "$form"
        # The :test alias's :main-opts, as `clj -M:test` would run them.
        check deps-test smoke "" \
            java -cp "$(cat "$test_cp_file")" clojure.main -m kvstore-test-runner
    else
        fail deps-run "$logs/clojure-deps-resolve.log"
        record deps-test "deps.edn's classpath did not resolve"
    fi
    rm -f "$cp_file" "$test_cp_file"
else
    echo "tools.deps not found (apt-get install libtools-deps-clojure)"
    record deps-run "tools.deps not found"
    record deps-test "tools.deps not found"
fi

[ "$had_target" -eq 0 ] && rm -rf target
[ "$had_lein_failures" -eq 0 ] && rm -f .lein-failures
totals
