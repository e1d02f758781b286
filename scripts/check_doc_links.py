#!/usr/bin/env python3
"""Checks the relative links of README.md, ARCHITECTURE.md and docs/*.md: every linked
file exists, and every `#anchor` names a heading of its file (GitHub's rule: lower
case, punctuation dropped, spaces as dashes). Prints each broken link; exits 1 if any."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path):
    found, fence = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def main():
    broken = []
    for doc in [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{doc.relative_to(ROOT)}: {target}: no such heading")
    for b in broken:
        print(b)
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
