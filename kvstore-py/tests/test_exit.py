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


FORK = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import kvstore as kv

    def child_of(fn):
        # Runs fn in a child of fork(); the child must end by itself, with code 0.
        pid = os.fork()
        if pid == 0:
            fn()
            sys.exit(0)  # a normal exit: the package's exit hook runs in the child
        deadline = time.time() + 20
        while time.time() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0, status
                return
            time.sleep(0.01)
        os.kill(pid, 9)
        raise SystemExit("the child hung")

    def fresh():
        # No store in the parent yet: stores work in the child.
        store = kv.create("local")
        store.init(list(range(256)), [np.ones(4)] * 256)
        outs = [np.zeros(4) for _ in range(256)]
        store.pull(list(range(256)), out=outs)
        store.push_async(3, np.ones(4)).result(10)
        assert all((o == 1).all() for o in outs)

    child_of(fresh)

    store = kv.create("local")
    keys = list(range(256))
    store.init(keys, [np.zeros(4)] * 256)
    store.set_updater(lambda key, recv, stored: time.sleep(0.2))
    queued = store.push_async(0, np.ones(4))  # still running when the child starts

    def refuses(call):
        try:
            call()
        except kv.UnsupportedError as e:
            assert "fork" in str(e), e
            return
        raise AssertionError(f"{call} did not fail")

    def forked():
        refuses(lambda: store.pull(keys, out=[np.zeros(4) for _ in keys]))
        refuses(lambda: store.push_async(1, np.ones(4)).result())
        refuses(lambda: queued.result())
        refuses(lambda: queued.add_done_callback(print))
        refuses(store.wait_all)
        refuses(lambda: kv.create("local"))
        assert not queued.done() and "KVStore" in repr(store)

    child_of(forked)
    child_of(lambda: None)  # an exit with a call pending in the parent
    queued.result(10)
    print("every child ended", flush=True)
    """
)


def test_a_forked_child_refuses_the_parents_stores_and_exits_cleanly():
    # A child of fork() has none of the store's threads: every call of a store made
    # before the fork fails naming fork (a 256-key pull, a future's result and
    # wait_all hung for ever), and the child exits cleanly with a call pending.
    done = subprocess.run([sys.executable, "-c", FORK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "every child ended" in done.stdout, done.stderr[-3000:]
