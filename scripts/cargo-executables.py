"""Reads `cargo ... --message-format=json` on stdin and prints `NAME PATH` for each
executable it built (test binaries and examples), one per line."""
import json
import sys

for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"] + " " + m["executable"])
