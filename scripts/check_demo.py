"""Checks what `make demo` printed (its log is the one argument): each tutorial shows
MXNet's tutorial values in order, and each training example learns the true weights.
Exits 1 naming the first part that differs, so a broken or deleted demo fails CI.
"""

import re
import sys

# The values MXNet's KVStore tutorial shows, step by step (seeds/python-kvstore-tutorial.txt):
# init 2; push 8; push from four devices 4; pull 4 (into b); with the updater: pull 4,
# push -> 6, pull into b 6; list of keys 3; from four devices 11.
RUST_TUTORIAL = [2, 8, 4, 4, 4, 6, 6, 3, 11]
# The Python tutorial prints the same steps but the first pull into b.
PYTHON_TUTORIAL = [2, 8, 4, 4, 6, 6, 3, 11]
UPDATES = ["3", "5", "7", "9", "5", "7", "9"]
CLOJURE_TUTORIAL = "clojure/examples/tutorial.clj"


def sections(log):
    """The log split at `make demo`'s `== title ==` lines: {title: [lines]}."""
    parts, title = {}, None
    for line in log.splitlines():
        m = re.match(r"^== (.*) ==$", line)
        if m:
            title = m.group(1)
            parts[title] = []
        elif title is not None:
            parts[title].append(line)
    return parts


def arrays(lines):
    """The arrays printed in `lines`, each as the list of its numbers (a printed array
    starts with `[[` and ends at the line that closes it)."""
    found, current = [], None
    for line in lines:
        if current is None and line.startswith("[["):
            current = []
        if current is not None:
            current += [float(x) for x in re.findall(r"-?\d+(?:\.\d*)?", line)]
            if line.rstrip().endswith("]]"):
                found.append(current)
                current = None
    return found


def uniform_values(lines):
    """Each printed array's one value; an array whose elements differ is an error."""
    values = []
    for a in arrays(lines):
        if not a or any(x != a[0] for x in a):
            raise AssertionError(f"an array's elements differ: {a}")
        values.append(a[0])
    return values


def check_tutorial(lines, expected):
    got = uniform_values(lines)
    if got != expected:
        raise AssertionError(f"values {got}, expected {expected}")
    updates = [m.group(1) for m in (re.match(r"^update on key: (\S+)$", l) for l in lines) if m]
    if updates != UPDATES:
        raise AssertionError(f"updater ran on keys {updates}, expected {UPDATES}")


def check_clojure_tutorial(lines):
    expected = [m.group(1).strip() for m in re.finditer(r"\)\s*;\s*=>\s*([\[(].*)", open(CLOJURE_TUTORIAL).read())]
    got = [l.strip() for l in lines if l.startswith("[") or l.startswith("(")]
    if not expected or got != expected:
        raise AssertionError(f"printed {got}, expected (the file's ;=> comments) {expected}")


def check_training(lines):
    losses = [float(m.group(1)) for m in (re.match(r"^epoch\s+\d+\s+loss\s+(\S+)$", l) for l in lines) if m]
    if len(losses) < 2 or not losses[-1] < 0.02 or not losses[-1] < losses[0]:
        raise AssertionError(f"losses {losses}: the last is not below 0.02 and the first")
    rows = [re.match(r"^(w\[\d+\]|b)\s+(-?\d+\.\d+)\s+(-?\d+\.\d+)$", l) for l in lines]
    rows = [(m.group(1), float(m.group(2)), float(m.group(3))) for m in rows if m]
    if len(rows) < 2:
        raise AssertionError("no table of learned and true parameters")
    for name, learned, true in rows:
        if abs(learned - true) > 0.05:
            raise AssertionError(f"{name} learned {learned}, true {true}")


CHECKS = {
    "the KVStore tutorial in Rust": lambda ls: check_tutorial(ls, RUST_TUTORIAL),
    "the KVStore tutorial in Clojure": check_clojure_tutorial,
    "the KVStore tutorial in Python": lambda ls: check_tutorial(ls, PYTHON_TUTORIAL),
    "data-parallel training with an optimizer, in Rust": check_training,
    "data-parallel training with an optimizer, in Clojure": check_training,
}


def main(path):
    parts = sections(open(path, errors="replace").read())
    failed = 0
    for prefix, check in CHECKS.items():
        titles = [t for t in parts if t.startswith(prefix)]
        try:
            if not titles:
                raise AssertionError("not in the log")
            check(parts[titles[0]])
            print(f"demo ok: {prefix}")
        except AssertionError as e:
            print(f"demo FAILED: {prefix}: {e}")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
