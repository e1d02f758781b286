#!/usr/bin/env python3
"""The README's performance table, generated from committed results files.

The README holds the table between the lines `<!-- bench-table:begin -->` and
`<!-- bench-table:end -->`; nothing in it is typed by hand. HEADLINES names each row:
the results file under bench/results/ (a `make bench` report or a GPU bundle's
gpu-results.json), the row's name there, and the label the README shows.

Usage:
  readme_bench_table.py --write README.md   rewrites the table from the results files
  readme_bench_table.py --check README.md   exits 1 if the README's table differs
                                            (make test runs this)
"""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CPU = "bench/results/cpu-2vcpu-2026-11-26.json"
GPU = "bench/results/nvidia-h100-80gb-hbm3-2026-11-26.json"

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
    (GPU, "NVIDIA H100 80GB HBM3: 4-input reduce of 64 Mi f32 (3048 GB/s)", "GPU: 4-input sum of 64 Mi f32",
     "the device copy's bandwidth"),
    (GPU, "NVIDIA H100 80GB HBM3: kvstore 4-input reduce vs torch a+b+c+d", "GPU: the same sum",
     "PyTorch's a + b + c + d"),
    (GPU, "NVIDIA H100 80GB HBM3: fused adam step of 64 Mi f32 (2836 GB/s)", "GPU: Adam step of 64 Mi f32",
     "the device copy's bandwidth"),
]

BEGIN = "<!-- bench-table:begin -->"
END = "<!-- bench-table:end -->"


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
            sys.exit(f"readme_bench_table.py: {path} has {len(rows)} rows named {name!r}")
        row = rows[0]
        ratio = row.get("ratio")
        if ratio is None and row.get("limit_s"):
            ratio = row["limit_s"] / row["median_s"]
        if ratio is None:
            sys.exit(f"readme_bench_table.py: {path}: row {name!r} has no ratio")
        lines.append(f"| {label} | {machine(results)} | {seconds(row['median_s'])} | {against} | {ratio:.2f} |")
    lines.append("")
    lines.append("The results files are in `bench/results/`, one per machine; `scripts/readme_bench_table.py` names them.")
    return "\n".join(lines)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("--write", "--check"):
        sys.exit(__doc__)
    readme = pathlib.Path(sys.argv[2])
    text = readme.read_text(encoding="utf-8")
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        sys.exit(f"readme_bench_table.py: {readme} needs one {BEGIN} and one {END} line")
    head, rest = text.split(BEGIN + "\n", 1)
    _, tail = rest.split(END, 1)
    new = head + BEGIN + "\n" + table() + "\n" + END + tail
    if sys.argv[1] == "--write":
        readme.write_text(new, encoding="utf-8")
    elif new != text:
        sys.exit(f"readme_bench_table.py: the table in {readme} is not the one the results files give: "
                 f"run scripts/readme_bench_table.py --write {readme}")


if __name__ == "__main__":
    main()
