#!/usr/bin/env bash
# kvstore-cuda's GPU tests, shown uncaptured: on a machine without a CUDA device each
# must print `SKIP: no CUDA device (...)` and pass (and the no-CUDA error test must
# pass); on a GPU machine they must all pass. Also checks that KVSTORE_REQUIRE_CUDA=1
# turns a skip into a failure, so a GPU run cannot pass vacuously.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(cargo test -q -p kvstore-cuda --test gpu -- --nocapture --test-threads=1 2>&1)
status=$?
echo "$out" | grep -oE 'SKIP: no CUDA device.*|^test result.*'
[ "$status" -eq 0 ] || { echo "$out" | tail -n 30; exit 1; }
if echo "$out" | grep -q 'SKIP: no CUDA device'; then
    # Every test of the binary skips but one: the check of the errors without CUDA.
    total=$(echo "$out" | sed -n 's/^test result: ok\. \([0-9]*\) passed.*/\1/p' | head -n 1)
    skips=$(echo "$out" | grep -o 'SKIP: no CUDA device' | wc -l)
    [ -n "$total" ] && [ "$skips" -eq $((total - 1)) ] ||
        { echo "expected $((${total:-0} - 1)) skipped GPU tests (all but one of $total), saw $skips"; exit 1; }
    if KVSTORE_REQUIRE_CUDA=1 cargo test -q -p kvstore-cuda --test gpu >/dev/null 2>&1; then
        echo "KVSTORE_REQUIRE_CUDA=1 passed without a GPU"
        exit 1
    fi
    echo "no CUDA device here: $skips GPU tests skipped, and KVSTORE_REQUIRE_CUDA=1 fails them"
fi
