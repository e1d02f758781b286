#!/usr/bin/env bash
# Adds up test results in logs and prints "PASSED FAILED" (two numbers, 0 0 when none):
#   count-results.sh cargo FILE...    the `test result: ... N passed; N failed` lines of
#                                     cargo's test harness
#   count-results.sh suites FILE...   the `name: N passed, N failed` summary lines of this
#                                     project's suite scripts
# The one place these formats are parsed (scripts/test.sh, scripts/test-mpi.sh).
set -uo pipefail
mode=${1:-}
shift || true
case $mode in
cargo)
    awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
         END { print p + 0, f + 0 }' "$@" 2>/dev/null || echo "0 0"
    ;;
suites)
    grep -hE '^[a-z][a-z-]*: [0-9]+ passed, [0-9]+ failed$' "$@" 2>/dev/null |
        awk '{ p += $2; f += $4 } END { print p + 0, f + 0 }'
    ;;
*)
    echo "usage: count-results.sh cargo|suites FILE..." >&2
    exit 2
    ;;
esac
