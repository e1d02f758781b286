"""Blocking calls wrap each numpy array once and reuse the wrapper in later calls (by
the address of its buffer, checked against its shape, dtype and flags each time): the
reuse must never read stale memory, outlive an array, or be seen by Python; and calls
on one memory through different wrappers (views, non-blocking calls' own wrappers)
take effect in call order."""

import gc
import resource
import threading
import weakref

import numpy as np
import pytest

import kvstore as kv


def f32(v, n=4):
    return np.full(n, v, np.float32)


def ptr(a):
    return a.__array_interface__["data"][0]


@pytest.fixture
def store():
    s = kv.create("local")
    s.init(["a", "b"], [f32(0), f32(0)])
    return s


def test_arrays_made_and_freed_call_after_call_are_read_afresh(store):
    # CPython reuses a freed array's address (and often its buffer) for the next one:
    # each call must read the array it was given.
    for i in range(300):
        v = f32(i)
        store.push("a", v)
        out = np.empty(4, np.float32)
        store.pull("a", out=out)
        assert (out == i).all(), f"step {i}: pulled {out}"
        del v, out


def test_an_array_given_a_new_shape_or_dtype_in_place_is_checked_again(store):
    a = f32(1)
    store.push("a", a)
    a.shape = (2, 2)  # the same object and buffer, another shape
    with pytest.raises(kv.ShapeMismatchError):
        store.push("a", a)
    with pytest.raises(kv.ShapeMismatchError):
        store.pull("a", out=a)
    a.shape = (4,)
    store.pull("a", out=a)
    assert (a == 1).all()
    a.dtype = np.int32  # the same buffer read as another dtype
    with pytest.raises(kv.DTypeMismatchError):
        store.push("a", a)


def test_an_array_made_read_only_after_a_pull_refuses_the_next(store):
    store.push("a", f32(3))
    out = f32(0)
    store.pull("a", out=out)
    assert (out == 3).all()
    out.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        store.pull("a", out=out)
    store.push("a", out)  # a read-only array may still be pushed
    out.setflags(write=True)
    store.push("a", f32(5))
    store.pull("a", out=out)
    assert (out == 5).all()


def test_an_array_first_seen_read_only_is_written_once_writable(store):
    # (A shape no earlier test's array had, and every array of this test alive to the
    # end: no freed array's wrapper is found at `late`'s address.)
    zeros, fives = f32(0, 7), f32(5, 7)
    store.init("odd", zeros)
    late = f32(0, 7)
    late.setflags(write=False)
    store.push("odd", late)
    late.setflags(write=True)
    store.push("odd", fives)
    store.pull("odd", out=late)
    assert (late == 5).all()


def test_a_resized_array_is_read_at_its_new_buffer(store):
    store.init("c", f32(0, 8))
    a = f32(2)
    store.push("a", a)
    a.resize(8, refcheck=True)  # the store holds no reference: numpy may move it
    a[:] = 6
    store.push("c", a)
    assert (store.pull("c") == 6).all()


def test_arrays_are_freed_with_their_objects(store):
    a, out = f32(1), f32(0)
    store.push("a", a)
    store.pull("a", out=out)
    store.pushpull("b", [a, a], out=out)
    refs = [weakref.ref(a), weakref.ref(out)]
    del a, out
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_one_array_many_times_in_one_call(store):
    a = f32(1)
    store.push("a", [a, a, a])
    store.pull(["a", "b"], out=[a, f32(0)])
    assert (a == 3).all()
    store.pushpull("a", [a, a], out=[a, a])
    assert (a == 6).all()


def test_more_arrays_than_are_kept_in_one_call(store):
    # Past the number of arrays kept for reuse, the kept ones are dropped mid-call:
    # the call's own arrays stay good.
    n = (1 << 14) + 100
    values = [f32(1) for _ in range(n)]
    store.push("a", values)
    assert (store.pull("a") == n).all()
    store.push("a", values[:3])
    assert (store.pull("a") == 3).all()


def test_an_updater_sees_the_stores_memory_not_the_pushed_arrays():
    # Reused arrays hold no reference to their objects, so no Python code may keep a
    # view of one past the call: an updater's `recv` and `stored` are the store's own
    # buffers. Were they a pushed array, a view kept by the updater would outlive it.
    for name in ("local", "device"):
        store = kv.create(name)
        store.init(["a", "b"], [f32(0), f32(0)])
        seen = []

        def updater(key, recv, stored):
            seen.extend([ptr(recv), ptr(stored)])
            stored += recv

        store.set_updater(updater)
        one, two, three = f32(1), f32(2), f32(3)
        for _ in range(2):
            store.push("a", one)
            store.push("a", [two, three])
            store.push(["a", "b"], [one, two])
            store.pushpull("b", three, out=two)
        pushed = {ptr(one), ptr(two), ptr(three)}
        assert seen and not pushed & set(seen), name


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / (1 << 20)


def test_memory_stays_bounded_with_a_new_array_each_call(store):
    for i in range(20000):
        store.push("a", f32(i))
    start = rss_mib()
    for i in range(100000):
        store.push("a", f32(i))
    grown = rss_mib() - start
    assert grown < 16, f"RSS grew by {grown:.1f} MiB over 100,000 pushes of new arrays"
    out = f32(0)
    store.pull("a", out=out)
    assert (out == 99999).all()


def test_threads_pushing_and_pulling_the_same_arrays(store):
    values = [f32(1) for _ in range(8)]
    outs = [f32(0) for _ in range(8)]
    errors = []

    def work():
        try:
            for _ in range(300):
                store.push("a", values)
                store.pull("a", out=outs)
                assert all((o == 8).all() for o in outs)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_calls_on_one_memory_through_new_wrappers_take_effect_in_call_order():
    n = 1 << 16
    s = kv.create("local")
    s.init("a", np.full(n, 7, np.float32))
    s.init("b", np.full(n, 5, np.float32))
    s.init("c", np.zeros(n, np.float32))
    for _ in range(20):
        for view in (lambda o: o, lambda o: o[:]):
            s.push_async("a", np.ones(n, np.float32))
            o = np.zeros(n, np.float32)
            f = s.pull_async("a", out=view(o))
            s.pull("b", out=view(o))
            f.result()
            assert (o == 5).all(), "the later, blocking pull's value"
            f = s.pull_async("a", out=view(o))
            s.push("c", view(o))
            f.result()
            c = np.zeros(n, np.float32)
            s.pull("c", out=c)
            assert (c == 1).all(), "the push read what the pull before it wrote"


def test_threads_calling_through_two_views_of_one_array_do_not_tear_it():
    n = 1 << 16
    s = kv.create("local")
    s.init(["a", "b", "c"], [np.full(n, 7, np.float32), np.full(n, 5, np.float32), np.zeros(n, np.float32)])
    shared = np.full(n, 7, np.float32)
    stop = threading.Event()

    def pull(key, view):
        while not stop.is_set():
            s.pull(key, out=view)

    threads = [threading.Thread(target=pull, args=a) for a in (("a", shared), ("b", shared[:]))]
    for t in threads:
        t.start()
    torn = 0
    seen = np.zeros(n, np.float32)
    try:
        for _ in range(1000):
            # A push reads its value whole, under the lock of the array it reads.
            s.push("c", shared[:])
            s.pull("c", out=seen)
            torn += int(not (seen == seen[0]).all())
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert torn == 0, f"{torn} of 1000 pushes read a mix of the two pulls' values"


@pytest.mark.parametrize("copy", [True, False])
def test_a_non_blocking_call_made_while_a_blocking_call_on_its_memory_runs_does_not_tear_it(copy):
    n = 1 << 20
    s = kv.create("local")
    s.init(list(range(5)), [np.zeros(n, np.float32)] * 5)
    for k in range(4):
        s.push(k, np.full(n, k + 1, np.float32))
    shared = np.zeros(n, np.float32)
    stop = threading.Event()

    def pull():
        k = 0
        while not stop.is_set():
            s.pull(k % 4, out=shared)
            k += 1

    puller = threading.Thread(target=pull)
    puller.start()
    torn = 0
    seen = np.zeros(n, np.float32)
    try:
        for _ in range(300):
            # A view: another Python object over the same memory, wrapped for this call.
            s.push_async(4, shared[:], copy=copy).result()
            s.pull(4, out=seen)
            torn += int(seen.min() != seen.max())
    finally:
        stop.set()
        puller.join()
    assert torn == 0, f"{torn} of 300 pushes read a mix of two pulls' values"
