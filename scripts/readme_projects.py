#!/usr/bin/env python3
"""Extracts the user projects that README.md and the guides under docs/ tell users to
write, for scripts/test-user-projects.sh, so that the documents cannot drift from what
works.

A document marks its blocks with HTML comments (invisible when rendered), each on the
line before a fenced code block:

    <!-- file: lein/project.clj -->     the block is the file lein/project.clj
    <!-- run: lein -->                  the block is shell commands, run in the folder lein
    <!-- mpi-run: resume-java -->       the same, for a folder that needs the MPI builds
                                        (target/kvstore-mpi.jar, the wheel with kvstore[mpi],
                                        kvstore-run): run by the mpi group of make test
                                        (scripts/test-doc-mpi.sh), not with the others
    <!-- prints: lein -->               each line of the block must be printed by the
                                        run block(s) of lein before it (a check)
    <!-- program: rs-guide -->          the block (```rust, ```python, ```java or
                                        ```clojure) is a whole program, run in the
                                        folder rs-guide the way its language's
                                        quickstart in the README runs one (PROGRAMS);
                                        a prints block of rs-guide checks its output

A program's folder is made for it: Rust gets src/main.rs and a Cargo.toml that depends
on kvstore (the README's Rust quickstart's); Python runs with the venv of the
README's Python quickstart (its folder `python`, made before); Java is compiled and run
against target/kvstore.jar, Clojure run with it, as the README's quickstarts do.

Usage: readme_projects.py [--mpi] OUT_DIR ROOT DOCUMENT.md...
Writes every file under OUT_DIR (with /path/to/kvstore replaced by ROOT, the clone the
documents speak of), and OUT_DIR/steps.tsv: one line per run or prints block, in the
order of the documents and of their blocks, as `run<TAB>DIR<TAB>SCRIPT_FILE` or
`prints<TAB>DIR<TAB>LINES_FILE`. A prints block checks the output of the last run
block of its folder. The folders written are those without an mpi-run block; with --mpi,
those with one (their run blocks all count as mpi-run).
"""

import pathlib
import re
import sys

MARK = re.compile(r"^<!-- (file|run|mpi-run|prints|program): (\S+) -->$")
CLONE = "/path/to/kvstore"
JAR = f"{CLONE}/target/kvstore.jar"
CLOJURE_CP = f"{JAR}:/usr/share/java/clojure.jar:/usr/share/java/spec.alpha.jar:/usr/share/java/core.specs.alpha.jar"
CARGO_TOML = f"""[package]
name = "{{name}}"
version = "0.1.0"
edition = "2024"
rust-version = "1.95"

[dependencies]
kvstore = {{{{ path = "{CLONE}/kvstore" }}}}
"""


def java_class(text):
    m = re.search(r"^public class (\w+)", text, re.M)
    if not m:
        sys.exit("readme_projects.py: a Java program needs a `public class`")
    return m.group(1)


# By the block's language: (the files of the program's folder, the commands that run it).
PROGRAMS = {
    "rust": lambda name, text: ({"src/main.rs": text, "Cargo.toml": CARGO_TOML.format(name=name)}, "cargo run -q\n"),
    "python": lambda name, text: ({"main.py": text}, "../python/venv/bin/python main.py\n"),
    "java": lambda name, text: (
        {f"{java_class(text)}.java": text},
        f"javac -cp {JAR} {java_class(text)}.java\njava -cp {JAR}:. {java_class(text)}\n",
    ),
    "clojure": lambda name, text: ({"main.clj": text}, f"java -cp {CLOJURE_CP} clojure.main main.clj\n"),
}


def blocks(lines):
    """(kind, name, language, text) for every marked block, in order."""
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i].strip())
        i += 1
        if not m:
            continue
        if i >= len(lines) or not lines[i].startswith("```"):
            sys.exit(f"readme_projects.py: line {i}: a {m.group(1)} mark must stand right before a ``` block")
        language = lines[i][3:].strip().split(",")[0]
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        if i >= len(lines):
            sys.exit(f"readme_projects.py: the block after line {i} never ends")
        i += 1
        yield m.group(1), m.group(2), language, "\n".join(body) + "\n"


def main():
    args = sys.argv[1:]
    mpi = args[:1] == ["--mpi"]
    args = args[1:] if mpi else args
    if len(args) < 3:
        sys.exit(__doc__)
    out, root, documents = pathlib.Path(args[0]), args[1], args[2:]
    texts = [pathlib.Path(document).read_text(encoding="utf-8").splitlines() for document in documents]
    # The folders that need the MPI builds: each of their steps is the mpi group's.
    mpi_folders = {name for lines in texts for kind, name, _, _ in blocks(lines) if kind == "mpi-run"}
    steps = []
    n = 0
    for document, lines in zip(documents, texts):
        for kind, name, language, text in blocks(lines):
            n += 1
            folder = pathlib.PurePosixPath(name).parts[0] if kind == "file" else name
            if (folder in mpi_folders) != mpi:
                continue
            kind = "run" if kind == "mpi-run" else kind
            text = text.replace(CLONE, root)
            if ".." in pathlib.PurePosixPath(name).parts or name.startswith("/"):
                sys.exit(f"readme_projects.py: {document}: {kind} {name}: not a relative path")
            if kind == "program":
                if language not in PROGRAMS:
                    sys.exit(f"readme_projects.py: {document}: program {name}: no way to run ```{language}")
                files, run = PROGRAMS[language](name, text)
                for file, content in files.items():
                    path = out / name / file
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(content.replace(CLONE, root), encoding="utf-8")
                step = out / f".step-{n}-run"
                step.write_text(run.replace(CLONE, root), encoding="utf-8")
                steps.append(f"run\t{name}\t{step}")
            elif kind == "file":
                path = out / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            else:
                (out / name).mkdir(parents=True, exist_ok=True)
                step = out / f".step-{n}-{kind}"
                step.write_text(text, encoding="utf-8")
                steps.append(f"{kind}\t{name}\t{step}")
    if not steps:
        sys.exit("readme_projects.py: the documents have no run blocks")
    (out / "steps.tsv").write_text("\n".join(steps) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
