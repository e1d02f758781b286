#!/usr/bin/env python3
"""Totals JUnit XML reports (what the Java and Clojure runners write):
`junit_totals.py NAME REPORT.xml...` prints `NAME: N passed, N failed` for make test,
and, on standard error, one line per failed test and the number skipped. A test case
with a <failure> or an <error> failed; one with <skipped> counts neither way; a
report that is missing or not XML is one failure. Exits 1 if anything failed."""

import sys
import xml.etree.ElementTree as ET


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    name, reports = sys.argv[1], sys.argv[2:]
    passed = failed = skipped = 0
    if not reports:
        print(f"{name}: no report", file=sys.stderr)
        failed += 1
    for report in reports:
        try:
            root = ET.parse(report).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"{name}: {report}: {e}", file=sys.stderr)
            failed += 1
            continue
        for case in root.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                print(f"FAILED: {case.get('classname', '')} {case.get('name', '')}".rstrip(), file=sys.stderr)
            elif case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    if skipped:
        print(f"{name}: {skipped} skipped", file=sys.stderr)
    print(f"{name}: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
