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


DAEMONS = textwrap.dedent(
    """
    import threading, time
    import numpy as np
    import kvstore as kv

    store = kv.create("local")
    store.init(0, np.zeros(1000))

    def update(key, recv, stored):
        stored += recv

    store.set_updater(update)

    def sync():
        a = np.ones(1000)
        while True:
            store.push(0, a)

    for _ in range(4):
        threading.Thread(target=sync, daemon=True).start()
    time.sleep(0.2)
    print("leaving with daemon threads pushing", flush=True)
    """
)


def test_a_program_that_ends_while_daemon_threads_push_with_an_updater_exits_cleanly():
    # Daemon threads in blocking pushes whose Python updater runs on them or on the
    # store's threads, when the main thread ends: none may take the GIL once the
    # interpreter finalizes (it crashed with "PyGILState_Release" in most runs).
    for _ in range(10):
        done = subprocess.run([sys.executable, "-c", DAEMONS], capture_output=True, text=True, timeout=120)
        assert "leaving with daemon threads pushing" in done.stdout
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Fatal Python error" not in done.stderr and "panicked" not in done.stderr, done.stderr[-3000:]
