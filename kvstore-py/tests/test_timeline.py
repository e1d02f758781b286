"""The timeline and the counters from Python: ``start_timeline``/``stop_timeline``,
``stats``/``reset_stats`` on a local store, and ``python -m kvstore.timeline`` (the
summary of a trace, checked on a trace of known arrivals). The slow-rank job across
processes is in test_dist.py."""

import json
import subprocess
import sys

import numpy as np
import pytest

import kvstore as kv
from kvstore import timeline


def test_a_local_store_writes_its_calls_and_counts_them(tmp_path):
    path = tmp_path / "trace.json"
    store = kv.create("local")
    store.start_timeline(str(path))
    store.init(["a", "b"], [np.zeros(4, np.float32), np.zeros(4, np.float32)])
    store.push(["a", "b", "a"], [np.ones(4, np.float32)] * 3)
    out = np.zeros(4, np.float32)
    store.pull("a", out=out)
    assert str(store.stop_timeline()) == str(path)
    assert store.stop_timeline() is None
    doc = json.loads(path.read_text())
    names = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"]
    assert names.count("push") == 1 and names.count("pull") == 1 and names.count("init") == 1
    push = next(e for e in doc["traceEvents"] if e["name"] == "push")
    assert push["args"] == {"keys": 3, "bytes": 48, "key": "a"}
    s = store.stats()
    assert s["calls"] == {"init": {"calls": 1, "keys": 2}, "push": {"calls": 1, "keys": 3}, "pull": {"calls": 1, "keys": 1}}
    assert (s["bytes_pushed"], s["bytes_pulled"], s["wire_bytes_sent"], s["collectives"], s["ranks"]) == (48, 16, 0, 0, [])
    assert set(s["phases"]) == {"queued", "inputs", "sum", "wire", "update", "copy", "ranks"} and s["phases"]["sum"] > 0
    # Two keys of 16 bytes held; no optimizer state, no push buffer (the sums go
    # straight into the values).
    assert s["held"] == {"values": 32, "state": 0, "buffers": 0}
    store.reset_stats()
    assert store.stats()["calls"] == {} and store.stats()["bytes_pushed"] == 0
    assert store.stats()["held"]["values"] == 32
    store.set_optimizer(kv.optimizer.create("adam"))
    store.push(["a", "b", "a"], [np.ones(4, np.float32)] * 3)
    # Adam's mean and variance per key, and "a"'s buffer of its two values' sum.
    assert store.stats()["held"] == {"values": 32, "state": 64, "buffers": 16}


def test_a_timeline_that_cannot_be_made_raises_and_changes_nothing(tmp_path):
    store = kv.create("local")
    with pytest.raises(OSError):
        store.start_timeline(str(tmp_path / "missing" / "trace.json"))
    assert store.stop_timeline() is None


def trace(arrivals):
    """A merged trace whose collective k has rank r arriving at arrivals[k][r] (ms),
    each rank waiting in `ranks` until the last arrived, and one push per collective."""
    events = []
    for pid in range(len(arrivals[0])):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}})
    for step, at in enumerate(arrivals, start=1):
        end = max(at)
        for pid, t in enumerate(at):
            events.append({"ph": "i", "name": "arrive", "pid": pid, "tid": 1, "ts": t * 1000.0, "s": "t",
                           "args": {"step": step, "late_ms": 0.0, "last": 0}})
            events.append({"ph": "X", "name": "push", "cat": "call", "pid": pid, "tid": 1, "ts": t * 1000.0,
                           "dur": (end - t) * 1000.0 + 100.0, "args": {"keys": 1, "bytes": 4, "key": f"k{step % 2}"}})
            events.append({"ph": "X", "name": "ranks", "cat": "phase", "pid": pid, "tid": 1, "ts": t * 1000.0,
                           "dur": (end - t) * 1000.0})
    return {"traceEvents": events, "otherData": {"clock_error_ns": 0}}


def test_the_summary_names_the_rank_that_held_the_others_up(tmp_path):
    # Rank 1 arrives 10 ms after the others 8 times of 10; rank 2 is last twice, by 0.5
    # ms only (on time: within the 1 ms margin).
    arrivals = [[100.0 * k, 100.0 * k + 10.0, 100.0 * k] for k in range(8)]
    arrivals += [[100.0 * k, 100.0 * k, 100.0 * k + 0.5] for k in range(8, 10)]
    s = timeline.summarise(trace(arrivals)["traceEvents"])
    slowest = s["slowest"]
    assert (slowest["rank"], slowest["stands_out"], slowest["last"], slowest["collectives"]) == (1, True, 8, 10)
    assert slowest["held_up_ms"] == pytest.approx(80.0) and slowest["others_ms"] == pytest.approx(0.5)
    assert slowest["late_ms"] == pytest.approx((8 * 10.0 + 2 * -0.25) / 10)
    assert [s["ranks"][r]["last"] for r in range(3)] == [0, 8, 0]
    assert [s["ranks"][r]["held_up_ms"] for r in range(3)] == pytest.approx([0.0, 80.0, 1.0])
    assert s["ranks"][0]["waiting_ms"] == pytest.approx(8 * 10.0 + 2 * 0.5)
    line = ("slowest rank: 1 (held the others up 80.0 ms, the others 0.5 ms (median);"
            " last at 8 of 10 collectives, 8.0 ms late on average)")
    assert timeline.slowest_line(s) == line
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace(arrivals)))
    done = subprocess.run([sys.executable, "-m", "kvstore.timeline", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == line
    assert "k0:" in done.stdout and "k1:" in done.stdout


def test_the_slowest_rank_is_the_one_that_held_the_others_up_longest_not_the_one_last_most_often():
    # Rank 2 comes last at 9 collectives of 10, 2 ms after the others; rank 1 once,
    # 500 ms after them: rank 1 held them up longest, though it was last only once.
    arrivals = [[1000.0 * k, 1000.0 * k + (500.0 if k == 0 else 0.0), 1000.0 * k + (0.0 if k == 0 else 2.0)]
                for k in range(10)]
    s = timeline.summarise(trace(arrivals)["traceEvents"])
    assert [s["ranks"][r]["last"] for r in range(3)] == [0, 1, 9]
    assert (s["slowest"]["rank"], s["slowest"]["stands_out"]) == (1, True)
    assert timeline.slowest_line(s) == (
        "slowest rank: 1 (held the others up 500.0 ms, the others 9.0 ms (median);"
        " last at 1 of 10 collectives, 49.1 ms late on average)"
    )


def test_no_rank_stands_out_of_a_balanced_job():
    # Each rank comes last in turn, 0.3 ms after the others: within the noise.
    arrivals = [[10.0 * k + (0.3 if k % 3 == r else 0.0) for r in range(3)] for k in range(31)]
    s = timeline.summarise(trace(arrivals)["traceEvents"])
    assert (s["slowest"]["rank"], s["slowest"]["stands_out"]) == (0, False)
    assert timeline.slowest_line(s).startswith("slowest rank: none stands out (rank 0 held the others up 3.3 ms")


def test_the_longest_keys_count_fused_calls_shared_by_their_keys_bytes(tmp_path):
    # A fused call of 2 s (non-blocking pushes of w0 and w1 run as one: 3000 and 1000
    # bytes) and a push of k of 2.2 ms.
    events = [
        {"ph": "X", "name": "fused", "cat": "call", "pid": 0, "tid": 2, "ts": 0.0, "dur": 2_000_000.0,
         "args": {"keys": 2, "bytes": 4000, "key_bytes": {"w0": 3000, "w1": 1000}}},
        {"ph": "X", "name": "push", "cat": "call", "pid": 0, "tid": 1, "ts": 3_000_000.0, "dur": 2200.0,
         "args": {"keys": 1, "bytes": 16, "key": "k"}},
    ]
    s = timeline.summarise(events)
    assert [(k, round(ms, 1), n) for k, ms, n in s["keys"]] == [("w0", 1500.0, 1), ("w1", 500.0, 1), ("k", 2.2, 1)]
    path = tmp_path / "fused.json"
    path.write_text(json.dumps({"traceEvents": events}))
    done = subprocess.run([sys.executable, "-m", "kvstore.timeline", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "  w0: 1500.0 ms in 1 calls" in done.stdout.splitlines(), done.stdout


def test_the_summary_of_a_trace_without_collectives_says_so(tmp_path):
    path = tmp_path / "local.json"
    store = kv.create("local")
    store.start_timeline(str(path))
    store.init("w", np.zeros(2, np.float32))
    store.stop_timeline()
    done = subprocess.run([sys.executable, "-m", "kvstore.timeline", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "slowest rank: none (no collective of every rank in this trace)"
    bad = subprocess.run([sys.executable, "-m", "kvstore.timeline", str(tmp_path / "nothing.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot read" in bad.stderr


def test_the_summary_draws_lateness_waits_and_phases(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (scripts/test-python.sh installs it)")
    arrivals = [[100.0 * k, 100.0 * k + 10.0, 100.0 * k] for k in range(5)]
    path, png = tmp_path / "t.json", tmp_path / "steps.png"
    path.write_text(json.dumps(trace(arrivals)))
    done = subprocess.run([sys.executable, "-m", "kvstore.timeline", str(path), "--plot", str(png)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"wrote {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # The picture says what it shows: rank 1 held the others up 5 x 10 ms.
    said = ("rank 1 is the slow one: it held the others up 50.0 ms in all (the others 0.0 ms, median);"
            " last at 5 of 5 collectives, 10.0 ms late on average")
    assert b"Title\x00" + said.encode() in png.read_bytes()
    fig = timeline.figure(trace(arrivals)["traceEvents"])
    assert fig._suptitle.get_text().replace("\n", " ") == said


def test_the_plot_says_when_no_rank_stands_out():
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (scripts/test-python.sh installs it)")
    arrivals = [[10.0 * k + (0.3 if k % 3 == r else 0.0) for r in range(3)] for k in range(31)]
    fig = timeline.figure(trace(arrivals)["traceEvents"])
    assert fig._suptitle.get_text().startswith("no rank stands out: rank 0 held the others up most, 3.3 ms")


# A program that keeps its store in a global and ends without stopping the timeline.
_KEEPS_ITS_STORE = """
import numpy as np
import kvstore as kv
store = kv.create("local")
store.init("w", np.zeros(4, np.float32))
store.push("w", np.ones(4, np.float32))
"""


def test_the_file_of_kvstore_timeline_is_whole_when_the_program_ends(tmp_path):
    path = tmp_path / "trace.json"
    ran = subprocess.run(
        [sys.executable, "-c", _KEEPS_ITS_STORE],
        env={**__import__("os").environ, "KVSTORE_TIMELINE": str(path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(path.read_text())
    assert [e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "call"] == ["init", "push"]


def test_start_timeline_refuses_a_fifo_at_once(tmp_path):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    store = kv.create("local")
    with pytest.raises(ValueError, match="not a regular file"):
        store.start_timeline(str(fifo))  # (opening it to write would block)


@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": [{"ph": "X", "name": "a", "pid": "rank zero", "ts": 0, "dur": 1}]}',
        '{"traceEvents": [{"ph": "i", "name": "arrive", "pid": 0, "ts": 0}]}',
        "42",
    ],
)
def test_the_summary_of_a_trace_it_cannot_read_says_so(tmp_path, text):
    path = tmp_path / "foreign.json"
    path.write_text(text)
    done = subprocess.run([sys.executable, "-m", "kvstore.timeline", str(path)], capture_output=True, text=True)
    assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr, done.stderr
