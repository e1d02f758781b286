"""kvstore.torch.DataParallel across 2 ranks under mpirun (dist_sync): the digits example
(kvstore-py/examples/train_digits.py) learns, every rank ends with the same bits, two
runs give the same bits, and 2 ranks match 1 rank on the whole batches.

Needs torch, scikit-learn and an MPI: scripts/test-python-mpi.sh runs
this file in target/py-torch-mpi-venv (Debian's python3 with python3-torch and
python3-sklearn) with KVSTORE_REQUIRE_TORCH=1 and KVSTORE_REQUIRE_MPI=1, under which a
missing piece fails instead of skipping.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from kvstore import _kvstore

try:
    import sklearn  # noqa: F401
    import torch  # noqa: F401
except ImportError as e:
    if os.environ.get("KVSTORE_REQUIRE_TORCH") == "1":
        raise RuntimeError(f"KVSTORE_REQUIRE_TORCH=1 but an import fails: {e}") from e
    pytest.skip("torch or scikit-learn is not installed here (see scripts/test-python-mpi.sh)", allow_module_level=True)
if not _kvstore._has_mpi() or shutil.which("mpirun") is None:
    if os.environ.get("KVSTORE_REQUIRE_MPI") == "1":
        raise RuntimeError("KVSTORE_REQUIRE_MPI=1, but this build has no MPI or mpirun is missing")
    pytest.skip("this kvstore build has no MPI (see scripts/test-python-mpi.sh)", allow_module_level=True)

TESTS = pathlib.Path(__file__).resolve().parent
DIGITS = TESTS.parent / "examples" / "train_digits.py"
WORKER = TESTS / "dist" / "torch_worker.py"
EPOCH = re.compile(r"^epoch (\d+) loss (\d+\.\d+) accuracy (\d+\.\d+)$", re.M)


def run(script, *args, ranks=2, timeout=240):
    cmd = [sys.executable, str(script), *args]
    if ranks:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), *cmd]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def epochs(out):
    found = [(int(e), float(loss), float(acc)) for e, loss, acc in EPOCH.findall(out)]
    assert [e for e, _, _ in found] == [1, 2, 3, 4], out
    return found


def load(prefix, rank):
    return np.load(f"{prefix}.{rank}.npy")


@pytest.mark.parametrize("mode", ["sum", "optimizer"])
def test_digits_on_two_ranks_learns_one_model_the_same_as_one_rank(tmp_path, mode):
    out = run(DIGITS, "--mode", mode, "--save", str(tmp_path / "a"))
    assert "5.0 M parameters, 2 worker(s), store dist_sync" in out, out
    found = epochs(out)
    assert found[-1][2] >= 0.95, out
    assert found[-1][1] < found[0][1], out
    a0, a1 = load(tmp_path / "a", 0), load(tmp_path / "a", 1)
    assert a0.size > 4.9e6 and a0.dtype == np.float32
    assert a0.tobytes() == a1.tobytes(), "the ranks' weights differ"
    if mode == "sum":
        again = run(DIGITS, "--mode", mode, "--save", str(tmp_path / "b"))
        assert epochs(again) == found
        assert load(tmp_path / "b", 0).tobytes() == a0.tobytes(), "two runs differ"
        assert load(tmp_path / "b", 1).tobytes() == a0.tobytes(), "two runs differ"
    # One process, a local store, the whole batches.
    one = run(DIGITS, "--mode", mode, "--save", str(tmp_path / "one"), ranks=0)
    assert "1 worker(s), store local" in one, one
    assert epochs(one)[-1][2] >= 0.95, one
    w = load(tmp_path / "one", 0)
    np.testing.assert_allclose(a0, w, rtol=0, atol=1e-5)


def test_rank_0s_weights_win_and_the_gradients_are_averaged(tmp_path):
    run(WORKER, str(tmp_path / "w"))
    r0, r1 = (np.load(tmp_path / f"w.{r}.npz") for r in range(2))
    # The ranks built different weights (seeds 0 and 1); wrapping gave both rank 0's.
    torch.manual_seed(0)
    model0 = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    mine = torch.cat([p.detach().reshape(-1) for p in model0.parameters()]).numpy()
    assert np.array_equal(r0["init"], mine)
    assert np.array_equal(r1["init"], mine)
    # Each rank's own gradient differs; both end with their average.
    assert not np.array_equal(r0["own"], r1["own"])
    expected = (r0["own"] + r1["own"]) / 2
    assert r0["grad"].tobytes() == r1["grad"].tobytes()
    np.testing.assert_allclose(r0["grad"], expected, rtol=1e-6, atol=1e-7)
    assert r0["final"].tobytes() == r1["final"].tobytes()
    assert not np.array_equal(r0["final"], r0["init"])


EMBEDDINGS = TESTS.parent / "examples" / "train_embeddings.py"


def test_the_embedding_example_trains_a_table_each_rank_holds_half_of():
    # kvstore-py/examples/train_embeddings.py: a torch.nn.EmbeddingBag over the rows
    # each batch pulls from their owners; 2 ranks hold half the table and its state each.
    out = run(EMBEDDINGS, "--rows", "200000", "--steps", "150")
    last = re.findall(r"^step 150 loss (\d+\.\d+) accuracy (\d+\.\d+)$", out, re.M)
    assert last and float(last[0][1]) >= 0.9, out
    held = re.findall(r"^rank (\d) of 2 holds (\d\.\d+) of the table's values and (\d\.\d+) of its Adam state$", out, re.M)
    assert sorted(r for r, _, _ in held) == ["0", "1"], out
    for _, values, state in held:
        assert (float(values), float(state)) == (0.5, 0.5), out
