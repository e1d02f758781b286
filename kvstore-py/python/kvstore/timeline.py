"""Summarise a kvstore timeline: ``python -m kvstore.timeline PATH``.

A timeline is the Chrome Trace Event Format file a store writes with
``KVSTORE_TIMELINE=PATH`` or ``KVStore.start_timeline(PATH)`` (under ``mpirun``,
the file rank 0 merges at the end of the job). The summary gives, per rank, the time
spent computing between calls, waiting at collectives for the other ranks, holding the
others up, and late (arriving after the median of the others), the keys whose calls
took longest (a call counts for its first key; a fused call, non-blocking calls run as
one, is shared among its keys in proportion to their bytes), and one line naming the
slowest rank::

    slowest rank: 2 (held the others up 1216.6 ms, the others 0.3 ms (median); last at 30 of 31 collectives, 39.2 ms late on average)

The slowest rank is the one that held the others up longest: at each collective, the
rank that arrived last held the others up by its arrival minus the next-latest arrival
(the time they waited for it alone). It stands out when that total is more than
``STANDS_OUT`` (2) times the median of the other ranks' totals and more than
``LATE_MARGIN_MS`` (1 ms) above it; otherwise the line says that none stands out and
names the rank that held the others up most, with the same figures. A rank is last at
a collective when it arrives after every other rank and more than 1 ms after the
median of the others' arrivals (the collectives' own work is uneven: rank 0's sum in
shared memory takes tens of microseconds more); its lateness is its arrival minus that
median, averaged over every collective. The arrivals are the ``arrive`` instant events,
on rank 0's clock. The store's own code reads them (``kvstore::timeline::Lateness`` and
``Slowest``, through the native module): the summary of a trace and the line a job's
rank 0 logs name the slowest rank by one rule.
"""

import argparse
import json
import sys
import textwrap
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

from ._kvstore import _LATE_MARGIN_MS, _STANDS_OUT
from ._kvstore import _lateness as _store_lateness
from ._kvstore import _slowest as _store_slowest

__all__ = ["load", "summarise", "slowest_line", "conclusion", "figure", "main", "LATE_MARGIN_MS", "STANDS_OUT"]

#: How much later than the median of the others a rank must arrive to be last (ms); and
#: how much longer than the median of the others a rank must have held them up, in all,
#: to stand out as the slowest (the store's ``LATE_MARGIN``).
LATE_MARGIN_MS: float = _LATE_MARGIN_MS

#: How many times the median of the other ranks' totals a rank must have held the
#: others up to stand out as the slowest (the store's ``STANDS_OUT``).
STANDS_OUT: float = _STANDS_OUT


def load(path: str) -> List[Dict[str, Any]]:
    """The events of the trace at ``path``."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict) and "ph" in e]


def _arrivals(events: List[Dict[str, Any]]) -> Dict[int, Dict[int, float]]:
    """Each collective's arrivals: step -> rank -> ts (µs)."""
    steps: Dict[int, Dict[int, float]] = defaultdict(dict)
    for e in events:
        if e.get("ph") == "i" and e.get("name") == "arrive":
            steps[int(e["args"]["step"])][int(e["pid"])] = float(e["ts"])
    return steps


def _collective(at: Dict[int, float]) -> Tuple[Dict[int, float], Optional[int], Optional[Tuple[int, float]]]:
    """One collective's arrivals (rank -> ts, µs), read as the store reads them: each
    rank's lateness, its arrival minus the median of the others' (ms); the rank that
    arrived last by more than ``LATE_MARGIN_MS``, if one did; and the rank that held the
    others up, with how long (its arrival minus the next-latest, ms)."""
    ranks = sorted(at)
    first = min(at.values())
    late, last, held = _store_lateness([round((at[r] - first) * 1000.0) for r in ranks])
    return (
        {r: late[i] / 1e6 for i, r in enumerate(ranks)},
        None if last is None else ranks[last],
        None if held is None else (ranks[held[0]], held[1] / 1e6),
    )


def _slowest(out_ranks: Dict[int, Dict[str, Any]], collectives: int) -> Optional[Dict[str, Any]]:
    """The rank that held the others up longest (the lower of a tie), the median of the
    others' totals, whether it stands out (see the module's docs) and the line saying
    so, as the store names it."""
    if not collectives or not out_ranks:
        return None
    figures = [
        (r, p["held_up_ms"] / 1e3, int(p["last"]), float(p["late_ms"]) / 1e3) for r, p in sorted(out_ranks.items())
    ]
    found = _store_slowest(figures, collectives)
    if found is None:
        return None
    rank, others_s, stands_out, line = found
    return {
        "rank": rank,
        "held_up_ms": out_ranks[rank]["held_up_ms"],
        "others_ms": others_s * 1e3,
        "stands_out": stands_out,
        "last": int(out_ranks[rank]["last"]),
        "collectives": collectives,
        "late_ms": float(out_ranks[rank]["late_ms"]),
        "line": line,
    }


def summarise(events: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The summary of a trace's events, as a dict: ``ranks`` (per rank:
    ``held_up_ms`` (the time it held the others up, in all), ``last``,
    ``collectives``, ``late_ms`` (mean), ``late_total_ms``, ``waiting_ms``,
    ``computing_ms``), ``keys`` (the calls' first keys by total time, longest first:
    ``(key, ms, calls)``; a fused call's time is shared among its keys in proportion to
    their bytes, and counts as a call of each) and ``slowest`` (``None`` for a trace with no collective of
    every rank, else a dict: ``rank``, the one that held the others up longest;
    ``held_up_ms``; ``others_ms``, the median of the other ranks' totals;
    ``stands_out``; its ``last``, ``collectives`` and ``late_ms``; ``line``, what
    :func:`slowest_line` says)."""
    ranks = sorted({int(e["pid"]) for e in events if "pid" in e})
    per: Dict[int, Dict[str, float]] = {
        r: {
            "held_up_ms": 0.0,
            "last": 0,
            "collectives": 0,
            "late_sum_ms": 0.0,
            "late_total_ms": 0.0,
            "waiting_ms": 0.0,
            "computing_ms": 0.0,
        }
        for r in ranks
    }
    steps = _arrivals(events)
    complete = [s for s in steps.values() if len(s) == len(ranks)]
    for at in complete:
        late, last, held = _collective(at)
        if last is not None:
            per[last]["last"] += 1
        if held is not None:
            per[held[0]]["held_up_ms"] += held[1]
        for r, l in late.items():
            per[r]["collectives"] += 1
            per[r]["late_sum_ms"] += l
            per[r]["late_total_ms"] += max(l, 0.0)
    # Waiting: the `ranks` phases; computing: on each rank's busiest calling thread, the
    # time between its calls.
    calls: Dict[Tuple[int, int], List[Tuple[float, float]]] = defaultdict(list)
    keys: Dict[str, List[float]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        pid, dur = int(e["pid"]), float(e.get("dur", 0.0))
        if e.get("name") == "ranks":
            per[pid]["waiting_ms"] += dur / 1000.0
        if e.get("cat") == "call":
            calls[(pid, int(e["tid"]))].append((float(e["ts"]), float(e["ts"]) + dur))
            args = e.get("args") or {}
            shares = args.get("key_bytes")
            if isinstance(shares, dict) and shares:
                # A fused call (non-blocking calls run as one): its time shared among its
                # keys by their bytes, as its one allreduce moves them.
                total = sum(float(b) for b in shares.values())
                for k, b in shares.items():
                    part = float(b) / total if total > 0 else 1.0 / len(shares)
                    keys[str(k)].append(dur / 1000.0 * part)
            elif args.get("key") is not None:
                keys[str(args["key"])].append(dur / 1000.0)
    for r in ranks:
        threads = [on for (pid, _), on in calls.items() if pid == r]
        if not threads:
            continue
        sizes = [len(t) for t in threads]
        ordered = sorted(threads[sizes.index(max(sizes))])
        per[r]["computing_ms"] = sum(max(b[0] - a[1], 0.0) for a, b in zip(ordered, ordered[1:])) / 1000.0
    out_ranks: Dict[int, Dict[str, Any]] = {}
    for r in ranks:
        p = per[r]
        n = int(p["collectives"])
        out_ranks[r] = {
            "held_up_ms": p["held_up_ms"],
            "last": int(p["last"]),
            "collectives": n,
            "late_ms": p["late_sum_ms"] / n if n else 0.0,
            "late_total_ms": p["late_total_ms"],
            "waiting_ms": p["waiting_ms"],
            "computing_ms": p["computing_ms"],
        }
    longest = sorted(((k, sum(v), len(v)) for k, v in keys.items()), key=lambda x: -x[1])
    slowest = _slowest(out_ranks, len(complete)) if complete else None
    return {"ranks": out_ranks, "keys": longest, "slowest": slowest}


def slowest_line(summary: Dict[str, Any]) -> Optional[str]:
    """``slowest rank: R (held the others up X ms, the others Y ms (median); last at N
    of M collectives, Z ms late on average)``, or ``slowest rank: none stands out
    (rank R held the others up most: ...)`` when no rank stands out; ``None`` for a
    trace with no collective of every rank."""
    s = summary["slowest"]
    return None if s is None else str(s["line"])


def conclusion(summary: Dict[str, Any]) -> str:
    """What the plot concludes, in its title: the rank that held the others up and by
    how much, or that none stands out (the figures of :func:`slowest_line`)."""
    s = summary["slowest"]
    if s is None:
        return "no collective of every rank in this trace: no slow rank to name"
    both = (
        f"{s['held_up_ms']:.1f} ms in all (the others {s['others_ms']:.1f} ms, median);"
        f" last at {s['last']} of {s['collectives']} collectives, {s['late_ms']:.1f} ms late on average"
    )
    if s["stands_out"]:
        return f"rank {s['rank']} is the slow one: it held the others up {both}"
    return f"no rank stands out: rank {s['rank']} held the others up most, {both}"


def figure(events: List[Dict[str, Any]]) -> Any:
    """The plot of a trace's events, as a matplotlib figure: its title the conclusion
    (:func:`conclusion`); per rank, per collective, its lateness and its wait for the
    others; and per rank, its time in each phase."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError as missing:  # pragma: no cover - depends on the machine
        raise SystemExit(f"--plot needs matplotlib ({missing}): pip install matplotlib") from missing
    steps = _arrivals(events)
    ranks = sorted({int(e["pid"]) for e in events if "pid" in e})
    order = sorted(s for s, at in steps.items() if len(at) == len(ranks))
    waits: Dict[Tuple[int, int], float] = {}
    phases = ["sum", "wire", "update", "copy", "ranks", "inputs", "queued"]
    totals = {r: {p: 0.0 for p in phases} for r in ranks}
    # A non-blocking call's wait (`queued`) is an async span: its begin and end.
    began: Dict[Tuple[int, Any], float] = {}
    for e in events:
        pid = int(e.get("pid", -1))
        if pid not in totals:
            continue
        if e.get("ph") == "b" and e.get("name") == "queued":
            began[(pid, e.get("id"))] = float(e["ts"])
        elif e.get("ph") == "e" and e.get("name") == "queued" and (pid, e.get("id")) in began:
            totals[pid]["queued"] += (float(e["ts"]) - began.pop((pid, e.get("id")))) / 1000.0
        if e.get("ph") != "X":
            continue
        if e.get("name") in phases:
            totals[pid][e["name"]] += float(e.get("dur", 0.0)) / 1000.0
        if e.get("name") == "spread":  # sums and copies spread over a pool's threads
            spread = e.get("args") or {}
            totals[pid]["sum"] += float(spread.get("sum_us", 0.0)) / 1000.0
            totals[pid]["copy"] += float(spread.get("copy_us", 0.0)) / 1000.0
        if e.get("name") == "ranks" and "step" in (e.get("args") or {}):
            waits[(int(e["pid"]), int(e["args"]["step"]))] = float(e.get("dur", 0.0)) / 1000.0
    fig, (late_ax, wait_ax, phase_ax) = plt.subplots(3, 1, figsize=(10, 10))
    for r in ranks:
        late_ax.plot(range(len(order)), [_collective(steps[s])[0][r] for s in order], marker=".", label=f"rank {r}")
        wait_ax.plot(range(len(order)), [waits.get((r, s), 0.0) for s in order], marker=".", label=f"rank {r}")
    late_ax.axhline(LATE_MARGIN_MS, color="grey", linewidth=0.8, linestyle="--")
    late_ax.set_ylabel("lateness (ms)")
    late_ax.set_title("arrival at each collective, minus the median of the other ranks'")
    wait_ax.set_ylabel("waiting (ms)")
    wait_ax.set_title("time waiting at each collective for the other ranks")
    for ax in (late_ax, wait_ax):
        ax.set_xlabel("collective")
        ax.legend(loc="upper right")
    left = [0.0] * len(ranks)
    for p in phases:
        widths = [totals[r][p] for r in ranks]
        phase_ax.barh([f"rank {r}" for r in ranks], widths, left=left, label=p)
        left = [a + b for a, b in zip(left, widths)]
    phase_ax.set_xlabel("time in each phase, whole trace (ms)")
    phase_ax.legend(ncol=len(phases), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.suptitle(textwrap.fill(conclusion(summarise(events)), 110), fontsize=11, fontweight="bold")
    fig.tight_layout()
    return fig


def _plot(events: List[Dict[str, Any]], out: str) -> None:
    """Draws :func:`figure` into ``out``, its conclusion also in the PNG's ``Title``."""
    fig = figure(events)
    fig.savefig(out, dpi=90, metadata={"Title": conclusion(summarise(events))})


def main(argv: Optional[List[str]] = None) -> int:
    """The command: prints the summary of the trace at PATH (``--plot OUT.png`` also
    draws it)."""
    parser = argparse.ArgumentParser(prog="python -m kvstore.timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a timeline (KVSTORE_TIMELINE's file, merged by rank 0)")
    parser.add_argument(
        "--plot", metavar="OUT.png", help="draw each rank's lateness and phase times, the slow rank in the title"
    )
    parser.add_argument("--keys", type=int, default=5, help="how many of the longest keys to list (default 5)")
    args = parser.parse_args(argv)
    try:
        events = load(args.path)
        s = summarise(events)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        # (Not a trace this store wrote: a field missing or of another kind.)
        print(f"kvstore.timeline: cannot read {args.path}: {e!r}", file=sys.stderr)
        return 2
    print(f"{'rank':>4}  {'computing ms':>12}  {'waiting ms':>10}  {'held up ms':>10}  {'late ms':>9}  {'last':>4}  of")
    for r, p in s["ranks"].items():
        print(
            f"{r:>4}  {p['computing_ms']:>12.1f}  {p['waiting_ms']:>10.1f}  {p['held_up_ms']:>10.1f}"
            f"  {p['late_total_ms']:>9.1f}  {p['last']:>4}  {p['collectives']}"
        )
    if s["keys"]:
        print("longest keys (total ms, calls):")
        for key, ms, n in s["keys"][: args.keys]:
            print(f"  {key}: {ms:.1f} ms in {n} calls")
    line = slowest_line(s)
    print(line if line is not None else "slowest rank: none (no collective of every rank in this trace)")
    cut = sorted({int(e["pid"]) for e in events if e.get("name") == "truncated" and "pid" in e})
    if cut:
        print(
            f"note: the trace of rank {', '.join(map(str, cut))} stopped at KVSTORE_TIMELINE_MAX_BYTES:"
            " these counts cover only the collectives before it"
        )
    if args.plot:
        _plot(events, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
