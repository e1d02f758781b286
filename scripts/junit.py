#!/usr/bin/env python3
"""JUnit XML for `make test`: every suite reports its tests in JUnit XML files under one
folder (target/test-reports/SUITE/), and this script totals them.

  junit.py case DIR NAME [WHY]
      writes DIR/NAME.xml, one test case NAME: failed (saying WHY) when WHY is given,
      else passed. For a check that is a command's exit status. (A name given twice is
      two tests, the second named "NAME (2)".)
  junit.py skip DIR NAME WHY
      writes DIR/NAME.xml, one test case NAME skipped, saying WHY (a test that cannot
      run on this machine: it counts neither way, and the totals say it was skipped).
  junit.py ran DIR NAME STATUS REPORT [--no-skips]
      after a test runner that exited with STATUS and should have written REPORT: writes
      a failed case NAME into DIR when the runner failed without a failed case in REPORT
      (it crashed, wrote no report, or found no test), or, with --no-skips, when REPORT
      has a skipped test.
  junit.py total [--name NAME] PATH...
      totals the test cases of the XML files at each PATH (a file, or a folder searched
      recursively), prints `NAME: N passed, N failed` (or `N passed, N failed` without a
      name), one line per failed case and the number skipped on standard error, and exits
      1 if anything failed. Cases with the same class and name in
      one folder are one test that passed only if every one of them did: the reports of
      an MPI job's ranks. A case with <failure> or <error> failed; one with <skipped>
      counts neither way; a file that is not JUnit XML is one failure. Exits 2 (and counts
      a failure) when no case was found at all.
"""

import os
import re
import sys
import xml.etree.ElementTree as ET
from xml.sax.saxutils import quoteattr


def write(path, suite, cases):
    """Writes `cases` ((classname, name, why or None, skipped)) as one <testsuite>."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"<testsuite name={quoteattr(suite)} tests=\"{len(cases)}\">\n")
        for classname, name, why, skipped in cases:
            body = (
                f"<skipped message={quoteattr(why or '')}/>"
                if skipped
                else f"<failure message={quoteattr(why)}/>"
                if why is not None
                else ""
            )
            f.write(f"  <testcase classname={quoteattr(classname)} name={quoteattr(name)}>{body}</testcase>\n")
        f.write("</testsuite>\n")


def case(folder, name, why=None, skipped=False):
    """A second case of the same name in a folder is another test: "NAME (2)". (Its
    file's name is the name's first 100 safe characters, then "-2": a long name's
    "(2)" alone would be cut off, and its file found taken for ever.)"""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:100] or "case"
    n = 1
    while os.path.exists(os.path.join(folder, safe + (f"-{n}" if n > 1 else "") + ".xml")):
        n += 1
    path = os.path.join(folder, safe + (f"-{n}" if n > 1 else "") + ".xml")
    name = name if n == 1 else f"{name} ({n})"
    write(path, name, [(os.path.basename(os.path.abspath(folder)), name, why, skipped)])


def counts(report):
    """(failed, skipped, cases) of one report; None when it is missing or not XML."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return None
    cases = list(root.iter("testcase"))
    failed = sum(c.find("failure") is not None or c.find("error") is not None for c in cases)
    return failed, sum(c.find("skipped") is not None for c in cases), len(cases)


def ran(folder, name, status, report, no_skips):
    found = counts(report)
    if found is None:
        case(folder, name, f"exit status {status}, and no report {report}")
    elif status != 0 and (found[0] == 0 or found[2] == 0):
        case(folder, name, f"exit status {status} without a failed test")
    elif no_skips and found[1]:
        case(folder, name, f"{found[1]} tests skipped, where every test must run")


def reports(paths):
    for path in paths:
        if os.path.isdir(path):
            for root, _, files in sorted(os.walk(path)):
                yield from (os.path.join(root, f) for f in sorted(files) if f.endswith(".xml"))
        else:
            yield path


def total(name, paths):
    tests, broken = {}, []
    for report in reports(paths):
        try:
            root = ET.parse(report).getroot()
        except (OSError, ET.ParseError) as e:
            broken.append(f"{report}: {e}")
            continue
        folder = os.path.dirname(os.path.abspath(report))
        for c in root.iter("testcase"):
            key = (folder, c.get("classname", ""), c.get("name", ""))
            failed = c.find("failure") is not None or c.find("error") is not None
            skipped = c.find("skipped") is not None
            before = tests.get(key, "passed")
            tests[key] = "failed" if failed or before == "failed" else "skipped" if skipped else before
    verdicts = list(tests.values())
    passed, failed = verdicts.count("passed"), verdicts.count("failed") + len(broken)
    for line in broken:
        print(f"FAILED: {line}", file=sys.stderr)
    for (_, classname, test), verdict in sorted(tests.items()):
        if verdict == "failed":
            print(f"FAILED: {classname} {test}".rstrip(), file=sys.stderr)
    if verdicts.count("skipped"):
        print(f"{name or 'all'}: {verdicts.count('skipped')} skipped", file=sys.stderr)
    nothing = not tests and not broken
    if nothing:
        print(f"{name or 'all'}: no test case in {' '.join(paths)}", file=sys.stderr)
        failed += 1
    print(f"{name + ': ' if name else ''}{passed} passed, {failed} failed")
    return 2 if nothing else 1 if failed else 0


def main(argv):
    if len(argv) == 4 and argv[0] == "skip":
        case(argv[1], argv[2], argv[3], skipped=True)
        return 0
    if len(argv) >= 3 and argv[0] == "case":
        case(argv[1], argv[2], argv[3] if len(argv) > 3 else None)
        return 0
    if len(argv) in (5, 6) and argv[0] == "ran" and argv[5:] in ([], ["--no-skips"]):
        ran(argv[1], argv[2], int(argv[3]), argv[4], argv[5:] == ["--no-skips"])
        return 0
    if len(argv) >= 2 and argv[0] == "total":
        name = None
        if argv[1] == "--name" and len(argv) >= 4:
            name, argv = argv[2], argv[2:]
        return total(name, argv[1:])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
