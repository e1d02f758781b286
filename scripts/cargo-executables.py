"""Reads `cargo ... --message-format=json` on stdin and prints `NAME PATH` for each
executable it built, one per line: all of them, or with `--tests` only test binaries
(a library's unit tests and integration tests; `cargo test` also builds examples)."""
import json
import sys

for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    tests_only = "--tests" in sys.argv[1:]
    is_test = m.get("profile", {}).get("test", False)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and (is_test or not tests_only):
        print(m["target"]["name"] + " " + m["executable"])
