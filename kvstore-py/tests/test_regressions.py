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
