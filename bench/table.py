#!/usr/bin/env python3
"""The README's performance table and docs/benchmarks.md's results, generated from
the same committed results files.

The README holds the table between the lines `<!-- bench-table:begin -->` and
`<!-- bench-table:end -->`; nothing in it is typed by hand. HEADLINES names each row:
the results file under bench/results/ (a `make bench` report or a GPU bundle's
gpu-results.json), the row's name there, and the label the README shows.
docs/benchmarks.md holds, between `<!-- bench-results:begin -->` and
`<!-- bench-results:end -->`, every row of the same CPU file that has a target, with its
ratio and whether it met the target, and the spread of the rows that several committed
files of one machine hold.

Usage:
  table.py --write README.md docs/benchmarks.md   rewrites the generated parts
  table.py --check README.md docs/benchmarks.md   exits 1 if one differs
                                                               (make test runs this)
"""

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CPU = "bench/results/cpu-2vcpu-2026-11-29-2.json"
GPU = "bench/results/nvidia-h100-80gb-hbm3-2026-11-28.json"

# (results file, row name in it, label in the README, what the ratio is against)
HEADLINES = [
    (CPU, "store: push 4 x 4 Mi f32", "push 4 × 4 Mi f32", "all-core plain-loop sum"),
    (CPU, "store: pull 4 Mi f32 into 4 outs", "pull 4 Mi f32 into 4 outs", "all-core plain-loop copy"),
    (CPU, "store: 1000 keys x 1 Ki f32 x 4, list push + list pull (per key)",
     "1000 keys × 1 Ki f32 × 4, push + pull", "all-core plain loops"),
    (CPU, "store: Adam update of 4 Mi f32 through push", "Adam step of 4 Mi f32 through push",
     "plain loop over the same bytes"),
    (CPU, "store: row_sparse_pull of 1 % of its rows (vs the dense pull)",
     "row_sparse_pull of 1 % of a 1 M × 64 f32 embedding", "a dense pull of it"),
    (CPU, "python: kvstore vs MXNet 1.9.1, push 4 x 4 Mi f32", "Python: push 4 × 4 Mi f32",
     "MXNet 1.9.1's store"),
    (CPU, "python: kvstore vs MXNet 1.9.1, 1000 keys x 1 Ki f32 x 4 (per key, each in its own loop)",
     "Python: 1000 keys × 1 Ki f32 × 4", "MXNet 1.9.1's store"),
    (CPU, "torch: kvstore.torch (dist_sync) training step vs DDP, digits MLP 5.0 M, batch 50, 2 ranks",
     "PyTorch training step, 2 ranks", "PyTorch DDP (gloo)"),
    (CPU, "mpi 2 ranks: dist_sync push 64 MB f32", "dist_sync push of 64 MB, 2 ranks, shared memory",
     "MPI's own allreduce of it"),
    (CPU, "mpi 2 ranks over tcp, against gloo: dist_sync push of 64 MB f32, vs gloo",
     "dist_sync push of 64 MB, 2 ranks, TCP", "torch's gloo allreduce of it"),
    (GPU, "NVIDIA H100 80GB HBM3: 4-input reduce of 64 Mi f32 (3039 GB/s)", "GPU: 4-input sum of 64 Mi f32",
     "the device copy's bandwidth"),
    (GPU, "NVIDIA H100 80GB HBM3: kvstore 4-input reduce vs torch a+b+c+d", "GPU: the same sum",
     "PyTorch's a + b + c + d"),
    (GPU, "NVIDIA H100 80GB HBM3: fused adam step of 64 Mi f32 (2817 GB/s)", "GPU: Adam step of 64 Mi f32",
     "the device copy's bandwidth"),
]



def machine(results):
    """A short name of the machine a results file was measured on."""
    if "device" in results:
        return results["device"]
    m = results["machine"]
    return f"{m['cpu']}, {m['cores']} cores"


def seconds(s):
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def table():
    files = {}
    lines = [
        "| row | machine | time | against | ratio |",
        "|---|---|---|---|---|",
    ]
    for path, name, label, against in HEADLINES:
        if path not in files:
            files[path] = json.loads((ROOT / path).read_text(encoding="utf-8"))
        results = files[path]
        rows = [r for r in results["rows"] if r["name"] == name]
        if len(rows) != 1:
            sys.exit(f"bench/table.py: {path} has {len(rows)} rows named {name!r}")
        row = rows[0]
        ratio = ratio_of(row)
        if ratio is None:
            sys.exit(f"bench/table.py: {path}: row {name!r} has no ratio")
        lines.append(f"| {label} | {machine(results)} | {seconds(row['median_s'])} | {against} | {ratio:.2f} |")
    lines.append("")
    lines.append("The results files are in `bench/results/`, one per machine; `bench/table.py` names them.")
    return "\n".join(lines)


def load(path):
    return json.loads((ROOT / path).read_text(encoding="utf-8"))


def ratio_of(row):
    ratio = row.get("ratio")
    if ratio is None and row.get("limit_s"):
        ratio = row["limit_s"] / row["median_s"]
    return ratio


def verdict(name, ratio, target):
    """Whether a row met its target (`yes`/`no`), or None for a target that is not a
    bound: the targets say `>= x` or `> x` of the ratio, or `<= ... + x us (here +y us)`
    of a difference; `over tcp` ones bind only the rows over TCP, and a row of what is
    off over TCP is bound by nothing there."""
    if "over tcp" in target and "over tcp" not in name:
        return None
    if "where it is off: tcp" in target and "over tcp" in name:
        return None
    diff = re.search(r"<= (?:blocking )?\+ ?([0-9.]+) us \(here \+([0-9.]+) us\)", target)
    if diff:
        return "yes" if float(diff.group(2)) <= float(diff.group(1)) else "no"
    bound = re.search(r"(>=|>) ([0-9.]+)", target)
    if bound and ratio is not None:
        limit = float(bound.group(2))
        return "yes" if (ratio >= limit if bound.group(1) == ">=" else ratio > limit) else "no"
    return None


def results():
    """docs/benchmarks.md's generated part."""
    cpu = load(CPU)
    m = cpu["machine"]
    lines = [
        f"`{CPU}` ({machine(cpu)}, {m['mem_gib']} GiB, {cpu['runs']} runs per row; the file the README's",
        "table comes from), each row that has a target:",
        "",
        "| row | ratio | target | met |",
        "|---|---|---|---|",
    ]
    for row in cpu["rows"]:
        target = row.get("target") or ""
        met = verdict(row["name"], ratio_of(row), target)
        if met is None:
            continue
        ratio = ratio_of(row)
        lines.append(f"| {row['name']} | {'' if ratio is None else f'{ratio:.2f}'} | {target} | {met} |")
    # The spread of repeated runs: the rows that several committed files of one machine
    # hold (a row's name without its parenthesised figures, which vary by run).
    by_machine = {}
    for path in sorted((ROOT / "bench/results").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        by_machine.setdefault(machine(data), []).append((path.name, data))
    for name, files in by_machine.items():
        if len(files) < 2:
            continue
        ratios = {}
        for _, data in files:
            for row in data["rows"]:
                if ratio_of(row) is not None:
                    ratios.setdefault(re.sub(r" \([^)]*\)$", "", row["name"]), []).append(ratio_of(row))
        lines += [
            "",
            f"Repeated runs on one machine, {name}, in {len(files)} files "
            f"({', '.join(f'`{f}`' for f, _ in files)}): each row's ratios, lowest to highest:",
            "",
            "| row | runs | ratios |",
            "|---|---|---|",
        ]
        for row, values in ratios.items():
            if len(values) > 1:
                lines.append(f"| {row} | {len(values)} | {min(values):.2f} to {max(values):.2f} |")
    return "\n".join(lines)


# The generated parts of the documents, by the name in their markers.
SECTIONS = {"bench-table": table, "bench-results": results}


def regenerate(path, text):
    found = False
    for name, make in SECTIONS.items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        if text.count(begin) == 0 and text.count(end) == 0:
            continue
        if text.count(begin) != 1 or text.count(end) != 1:
            sys.exit(f"bench/table.py: {path} needs one {begin} and one {end} line")
        head, rest = text.split(begin + "\n", 1)
        _, tail = rest.split(end, 1)
        text = head + begin + "\n" + make() + "\n" + end + tail
        found = True
    if not found:
        sys.exit(f"bench/table.py: {path} has no generated part")
    return text


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("--write", "--check"):
        sys.exit(__doc__)
    for document in sys.argv[2:]:
        path = pathlib.Path(document)
        text = path.read_text(encoding="utf-8")
        new = regenerate(path, text)
        if sys.argv[1] == "--write":
            path.write_text(new, encoding="utf-8")
        elif new != text:
            sys.exit(f"bench/table.py: the generated part of {path} is not what the results files give: "
                     f"run bench/table.py --write {path}")


if __name__ == "__main__":
    main()
