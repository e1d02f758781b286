"""A program may end while non-blocking calls are still queued, even ones that run a
Python updater or callbacks: the interpreter waits for them at exit and never crashes."""

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import kvstore as kv

    store = kv.create("local")
    keys = list(range(20))
    store.init(keys, [np.zeros(100)] * len(keys))
    calls = []

    def update(key, recv, stored):
        time.sleep(0.0005)
        calls.append(key)
        stored += recv

    store.set_updater(update)
    for i in range(40):
        f = store.push_async(keys, [np.ones(100)] * len(keys))
        f.add_done_callback(lambda f: calls.append(None))
    print("leaving with calls queued", flush=True)
    """
)


def test_a_program_that_ends_with_calls_queued_exits_cleanly():
    for _ in range(5):
        done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "leaving with calls queued" in done.stdout
        assert "Fatal Python error" not in done.stderr and "panicked" not in done.stderr, done.stderr[-3000:]
