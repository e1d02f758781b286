"""Bugs found in the package by the conformance, property and interop suites, each
reproduced on its own (in a child process where the bug hangs the interpreter)."""

import subprocess
import sys
import textwrap

import pytest

DROP_WITH_UPDATER_IN_FLIGHT = textwrap.dedent(
    """
    import time
    import numpy as np
    import kvstore as kv

    store = kv.create("local")
    store.init("w", np.zeros(4, np.float32))
    calls = []
    store.set_updater(lambda key, recv, stored: (time.sleep(0.2), calls.append(key)))
    future = store.push_async("w", np.ones(4, np.float32))
    del store  # the push's updater has not run yet: the drop waits for it
    print(calls)
    future.result(10)
    """
)


def test_dropping_a_store_while_an_updater_call_is_in_flight_does_not_hang():
    # The store waited for its queued calls with the GIL held, and a queued call's
    # Python updater needs the GIL: a deadlock.
    try:
        run = subprocess.run(
            [sys.executable, "-c", DROP_WITH_UPDATER_IN_FLIGHT], capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the interpreter hung dropping the store (still waiting after 15 s)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['w']"


def test_outs_over_the_same_memory_are_written_in_key_order():
    # Each view (and each occurrence of one array) is wrapped on its own: the store
    # told outs apart by their wrappers and wrote them on several threads in no set
    # order, so `o` held an arbitrary key's value (seen 30, 92, 154, ...), not the last
    # key's as when one wrapper is given for every key (and in MXNet).
    import numpy as np
    import kvstore as kv

    store = kv.create("local")
    keys = list(range(256))
    store.init(keys, [np.full(256, k, np.float32) for k in keys])
    for _ in range(20):
        o = np.zeros(256, np.float32)
        store.pull(keys, out=[o[:] for _ in keys])
        assert (o == 255).all(), o[0]
        o = np.zeros(256, np.float32)
        store.pull(keys, out=[o] * 256)
        assert (o == 255).all(), o[0]
    for _ in range(20):
        vals = [np.full(256, 1000 + k, np.float32) for k in keys]
        store.pushpull(keys, vals, out=[vals[(k + 128) % 256][:] for k in keys])
        # Every value was read before any out was written: key k stores 1000 + k, and
        # the value half the list away holds it now.
        assert [v[0] for v in vals] == [1000 + (k + 128) % 256 for k in keys]
        assert store.pull(128)[0] == 1128
