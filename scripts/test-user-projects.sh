#!/usr/bin/env bash
# Uses kvstore from a user's own project, the way README.md and the guides say, with
# no network: scripts/readme_projects.py writes the projects and programs of README.md
# and of every guide under docs/ (the README's quickstarts in Clojure, Java, Rust and
# Python; deps.edn, Leiningen and Maven from docs/projects.md; each guide's programs in
# the four languages; the Rust GPU, dist_sync and dist_async programs, the last two
# under mpirun -np 2) into a temporary folder and runs their commands there, in order
# (`make install` first), checking that each prints what the document shows
# (scripts/check_docs.py checks that every program block is among them). Then the
# checks no README block can make: `lein repl :headless` answers an nREPL client, and
# the uberjar runs from another folder.
#
# HOME is a fresh folder for the run (so ~/.m2, ~/.lein and the native-library cache are
# the run's own and removed with it; cargo and rustup keep their homes), and cargo
# builds the Rust project into target/user-projects with this workspace's Cargo.lock
# (the versions already fetched). Each check is a test case in
# ${KVSTORE_REPORTS:-target/test-reports/user-projects}; prints one line
# `user-projects: N passed, N failed`.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/suite.sh
source scripts/doc-steps.sh
suite_init user-projects
rm -f "$logs"/user-projects-*.log "$logs"/user-projects-*.log.last

# Debian's tools for the three JVM routes, and the Maven plugins a plain jar project
# uses (compile, test, jar, exec:java).
pkgs=(leiningen libtools-deps-clojure clojure libnrepl-clojure libnrepl-incomplete-clojure maven
    libmaven-resources-plugin-java libmaven-compiler-plugin-java libsurefire-java libmaven-jar-plugin-java
    libmaven-install-plugin-java libexec-maven-plugin-java)
bash scripts/apt-install.sh "${pkgs[@]}" >"$logs/user-projects-apt.log" 2>&1
# Open MPI for docs/dist-sync.md's program (as root, mpirun wants these two).
bash scripts/setup-mpi.sh >>"$logs/user-projects-apt.log" 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

tmp=$(mktemp -d)
server=
cleanup() {
    # The whole process group: lein's launcher JVM and the REPL's JVM with it.
    [ -n "$server" ] && kill -- -"$server" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

export CARGO_HOME=${CARGO_HOME:-$HOME/.cargo} RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}
export CARGO_TARGET_DIR=$root/target/user-projects
export HOME=$tmp/home
# The JVM takes its home from the password database, not from HOME; its temporary
# files (Leiningen's form-init*.clj among them) go to the run's folder too.
export JAVA_TOOL_OPTIONS="-Duser.home=$HOME -Djava.io.tmpdir=$tmp/java-tmp"
mkdir -p "$HOME" "$tmp/java-tmp"
projects=$tmp/projects

python3 scripts/readme_projects.py "$projects" "$root" README.md docs/*.md >"$logs/user-projects-extract.log" 2>&1 ||
    give_up readme-blocks "$logs/user-projects-extract.log"
for toml in "$projects"/*/Cargo.toml; do
    [ -f "$toml" ] && cp Cargo.lock "$(dirname "$toml")/Cargo.lock"
done

run_doc_steps "$projects" user-projects

# `lein repl :headless`, offline, as an editor would use it: an nREPL client evaluates
# a form that uses kvstore in the project's REPL.
if [ -f "$projects/lein/project.clj" ]; then
    log=$logs/user-projects-lein-repl.log
    # In a process group of its own (setsid), so that killing the group ends lein's
    # launcher JVM and the REPL's JVM, not just the lein script.
    (cd "$projects/lein" && exec setsid lein repl :headless :port 0) </dev/null >"$log" 2>&1 &
    server=$!
    port=
    for _ in $(seq 1 120); do
        port=$(sed -n 's/^nREPL server started on port \([0-9]*\).*/\1/p' "$log")
        [ -n "$port" ] && break
        sleep 1
    done
    share=/usr/share/java
    if [ -n "$port" ] && timeout 120 java -cp "$share/nrepl.jar:$share/clojure.jar:$share/spec.alpha.jar:$share/core.specs.alpha.jar" \
        clojure.main -e "
          (require '[nrepl.core :as nrepl])
          (with-open [conn (nrepl/connect :port $port)]
            (let [code \"(do (require '[org.apache.clojure-mxnet.kvstore :as kvstore] '[org.apache.clojure-mxnet.ndarray :as ndarray])
                             (let [kv (kvstore/init (kvstore/create \\\"local\\\") \\\"w\\\" (ndarray/ones [3]))]
                               (kvstore/push kv \\\"w\\\" [(ndarray/ones [3]) (ndarray/ones [3])])
                               (ndarray/->vec (kvstore/pull kv \\\"w\\\"))))\"]
              (println \"nrepl value:\" (nrepl/response-values (nrepl/message (nrepl/client conn 60000) {:op \"eval\" :code code})))))" \
        >>"$log" 2>&1 && grep -qxF 'nrepl value: [[2.0 2.0 2.0]]' "$log"; then
        pass "lein repl :headless answers an nREPL client"
    else
        fail "lein repl :headless answers an nREPL client" "$log"
    fi
    kill -- -"$server" 2>/dev/null
    wait "$server" 2>/dev/null
    server=
    # Nothing of the REPL outlives the check (lein's launcher JVM used to).
    for _ in $(seq 50); do
        pgrep -f "$projects/lein" >/dev/null || break
        sleep 0.2
    done
    if pgrep -f "$projects/lein" >/dev/null; then
        fail "no process of lein repl is left" "$log"
        pkill -f "$projects/lein"
    else
        pass "no process of lein repl is left"
    fi
fi

# The uberjar carries the classes and the native library: it runs from anywhere.
jars=("$projects"/lein/target/*-standalone.jar)
if [ -f "${jars[0]}" ]; then
    log=$logs/user-projects-uberjar.log
    if (cd "$tmp" && timeout 120 java -jar "${jars[0]}") >"$log" 2>&1 &&
        jar --list --file "${jars[0]}" | grep -qxF 'native/linux-x86_64/libkvstore_jni.so'; then
        pass "the uberjar runs from another folder and holds the native library"
    else
        fail "the uberjar runs from another folder and holds the native library" "$log"
    fi
else
    fail "the README's Leiningen steps made an uberjar"
fi

totals
