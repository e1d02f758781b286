# What the suites of `make test` share; sourced by scripts/test*.sh and
# scripts/clojure-smoke.sh. A suite writes each of its tests as a case of JUnit XML into
# one folder, $reports, and ends with one line `NAME: N passed, N failed` that
# scripts/junit.py totals from there.
#
#   suite_init NAME        $reports: ${KVSTORE_REPORTS:-target/test-reports/NAME}, emptied;
#                          $root: the workspace; $logs: target/test-logs; $suite: NAME
#   record NAME [WHY]      a case: passed, or failed saying WHY
#   pass NAME [NOTE]       a passed case, printed `NAME: ok (NOTE)`
#   fail NAME [LOG]        a failed case, printed with the last lines of LOG
#   skip NAME WHY          a skipped case (it cannot run on this machine), printed
#                          `NAME: SKIPPED (WHY)`; the totals count it apart
#   give_up NAME [LOG]     fail, then the totals, then exit 1: a step the rest needs failed
#   stop NAME WHY          likewise, for a step that failed saying WHY (no log)
#   check NAME CMD...      runs CMD, its output into target/test-logs/$suite-NAME.log: pass
#                          if it exits with 0, else fail
#   totals                 the suite's line (status 1 when a case failed)
#   ran NAME STATUS REPORT [--no-skips]
#                          after a test runner that exited with STATUS and should have
#                          written REPORT: a failed case NAME where its failure is not
#                          in REPORT (see scripts/junit.py)
#   run_pytest NAME DIR PYTHON ARGS...
#                          pytest by PYTHON from folder DIR (so that the installed package
#                          is the one tested), logged to target/test-logs/$suite-NAME.log,
#                          its report $reports/pytest-NAME/report.xml, then `ran` (with
#                          --no-skips where the suite set skips_fail=1)
#   cached_venv DIR SPEC CHECK MAKE
#                          a virtualenv kept between runs while it was made from SPEC and
#                          the Python code CHECK runs in it; else remade by the command
#                          `MAKE DIR`
#   install_wheel DIR WHEEL  the kvstore wheel, reinstalled into the venv DIR
#   ready_venv KIND DIR WHEEL
#                          the cached venv DIR of KIND with the Debian packages it needs,
#                          the wheel reinstalled: `mxnet` (MXNet 1.9.1 from PyPI) or
#                          `torch` (Debian's python3 with its python3-torch and
#                          python3-sklearn, which PyPI's 5 GB CUDA build would replace)

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
logs=$root/target/test-logs
mkdir -p "$logs"

suite_init() {
    suite=$1
    reports=${KVSTORE_REPORTS:-$root/target/test-reports/$1}
    rm -rf "$reports"
    mkdir -p "$reports"
}

record() { python3 "$root/scripts/junit.py" case "$reports" "$@"; }

pass() {
    echo "$1: ok${2:+ ($2)}"
    record "$1"
}

fail() {
    if [ -n "${2:-}" ]; then
        echo "$1: FAILED (last lines of $2):"
        tail -n 40 "$2" | sed 's/^/    /'
        record "$1" "log: $2"
    else
        echo "$1: FAILED"
        record "$1" failed
    fi
}

skip() {
    echo "$1: SKIPPED ($2)"
    python3 "$root/scripts/junit.py" skip "$reports" "$1" "$2"
}

totals() { python3 "$root/scripts/junit.py" total --name "$suite" "$reports"; }

give_up() {
    fail "$@"
    totals
    exit 1
}

stop() {
    echo "$1: FAILED ($2)"
    record "$1" "$2"
    totals
    exit 1
}

check() {
    local name=$1 log=$logs/$suite-$1.log
    shift
    if "$@" >"$log" 2>&1; then pass "$name"; else fail "$name" "$log"; fi
}

ran() { python3 "$root/scripts/junit.py" ran "$reports" "$@"; }

run_pytest() {
    local name=$1 dir=$2 python=$3
    shift 3
    local log=$logs/$suite-$name.log report=$reports/pytest-$name/report.xml
    echo "== pytest ($name)"
    (cd "$dir" && "$python" -m pytest -q -p no:cacheprovider -o faulthandler_timeout=300 \
        --junitxml="$report" "$@") 2>&1 | tee "$log"
    ran "pytest ($name)" "${PIPESTATUS[0]}" "$report" ${skips_fail:+--no-skips}
}

cached_venv() {
    local dir=$1 spec=$2 check=$3 make=$4
    if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.kvstore-spec" 2>/dev/null)" = "$spec" ] &&
        "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
        return 0
    fi
    rm -rf "$dir"
    "$make" "$dir" && "$dir/bin/python" -c "$check" && echo "$spec" >"$dir/.kvstore-spec"
}

install_wheel() { "$1/bin/pip" install --quiet --force-reinstall --no-deps "$2"; }

mxnet_spec="mxnet==1.9.1 numpy<1.24 pytest"
make_mxnet_venv() {
    python3 -m venv "$1" && "$1/bin/pip" install --quiet --upgrade pip &&
        "$1/bin/pip" install --quiet mxnet==1.9.1 'numpy<1.24' pytest
}
torch_spec="debian-python3-torch python3-sklearn pytest ml_dtypes<0.5 numpy<2"
make_torch_venv() {
    /usr/bin/python3 -m venv --system-site-packages "$1" && "$1/bin/pip" install --quiet pytest 'ml_dtypes<0.5' 'numpy<2'
}

ready_venv() {
    local kind=$1 dir=$2 wheel=$3
    case $kind in
    mxnet)
        bash "$root/scripts/apt-install.sh" libgomp1 libquadmath0 &&
            cached_venv "$dir" "$mxnet_spec" "import mxnet, pytest, numpy" make_mxnet_venv
        ;;
    torch)
        bash "$root/scripts/apt-install.sh" python3-torch python3-sklearn python3-venv &&
            cached_venv "$dir" "$torch_spec" "import torch, sklearn, pytest, numpy, ml_dtypes" make_torch_venv
        ;;
    esac && install_wheel "$dir" "$wheel"
}
