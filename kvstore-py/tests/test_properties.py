"""Property tests: random sequences of init, push, pull, pushpull and broadcast, in
every argument form (one key, one key with many values, lists with repeated keys,
lists of lists), blocking and non-blocking (futures resolved at random points and by
``wait_all``), checked against a per-key model in plain numpy. Then the same from
several Python threads at once.

The model: with no updater a push assigns each key the sum of its values; with the
updater ``stored += recv * 2`` it adds twice the sum, and the updater is called once
per distinct key of a push, in the keys' first-init order, with the sum. Every call
takes effect in the order it was made, blocking or not. A call that fails (a key not
initialized, a duplicate init, a wrong shape) changes nothing.

Values are small integers in float32, float64 and int32, so every sum is exact.
Hypothesis runs derandomized (the same examples on every run) with no database.
"""

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvstore as kv

# The key universe: 3 and "3" are one key, as are 1 and "1".
SPECS = {
    "0": ((3,), np.float32),
    "1": ((2, 2), np.float32),
    "3": ((1,), np.int32),
    "a": ((4,), np.float64),
    "b": ((2, 3), np.float32),
}
KEY_OBJECTS = [0, 1, "1", 3, "3", "a", "b"]

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def norm(key):
    return str(key)


def zeros_for(key):
    shape, dtype = SPECS[norm(key)]
    return np.zeros(shape, dtype=dtype)


def flat(structure):
    """The arrays of a value or out argument, in order."""
    if isinstance(structure, list):
        return [a for item in structure for a in flat(item)]
    return [structure]


class Model:
    """What the store must hold, and what its updater must have been called with."""

    def __init__(self, updater):
        self.updater = updater
        self.values = {}  # normalized key -> array
        self.key_object = {}  # normalized key -> the key as first initialized
        self.order = []  # normalized keys in first-init order
        self.calls = []  # expected updater calls: (key object, recv)

    def missing(self, keys):
        return [k for k in keys if norm(k) not in self.values]

    def init(self, pairs):
        """Initializes (key, array) pairs; returns the error class expected, or None."""
        seen = set()
        for k, _ in pairs:
            if norm(k) in self.values or norm(k) in seen:
                return kv.AlreadyInitializedError
            seen.add(norm(k))
        for k, a in pairs:
            self.values[norm(k)] = a.copy()
            self.key_object[norm(k)] = k
            self.order.append(norm(k))
        return None

    def push(self, keys, pairs):
        """A push of (key, array) pairs over `keys` (the call's keys, which may have no
        values); returns the error class expected, or None."""
        if self.missing(keys):
            return kv.KeyNotInitializedError
        sums = {}
        for k, a in pairs:
            n = norm(k)
            sums[n] = a.copy() if n not in sums else sums[n] + a
        for n in sorted(sums, key=self.order.index):
            recv = sums[n].astype(self.values[n].dtype)
            if self.updater:
                self.calls.append((self.key_object[n], recv))
                self.values[n] = self.values[n] + recv * 2
            else:
                self.values[n] = recv
        return None

    def expected_outs(self, key_structure, out_structure):
        """The arrays each out of a pull must hold, in flat(out) order."""
        if not isinstance(key_structure, list):
            return [self.values[norm(key_structure)].copy() for _ in flat(out_structure)]
        got = []
        for k, o in zip(key_structure, out_structure):
            got += [self.values[norm(k)].copy() for _ in flat(o)]
        return got


def check_outs(outs, expected, what):
    assert len(outs) == len(expected), what
    for o, e in zip(outs, expected):
        assert o.dtype == e.dtype and o.shape == e.shape, what
        assert (o == e).all(), f"{what}: got {o.tolist()}, expected {e.tolist()}"


# ---------------------------------------------------------------- strategies


@st.composite
def an_array(draw, key, wrong_shape=False):
    shape, dtype = SPECS[norm(key)]
    if wrong_shape:
        shape = shape + (2,)
    n = int(np.prod(shape))
    data = draw(st.lists(st.integers(-8, 8), min_size=n, max_size=n))
    return np.array(data, dtype=dtype).reshape(shape)


@st.composite
def key_and_values(draw, make=an_array, allow_empty=True):
    """A call's keys and values in one of MXNet's forms, and the (key, array) pairs."""
    form = draw(st.sampled_from(["one", "many", "list", "nested"]))
    if form in ("one", "many"):
        k = draw(st.sampled_from(KEY_OBJECTS))
        if form == "one":
            a = draw(make(k))
            return k, a, [k], [(k, a)]
        arrays = draw(st.lists(make(k), min_size=0 if allow_empty else 1, max_size=4))
        return k, arrays, [k], [(k, a) for a in arrays]
    keys = draw(st.lists(st.sampled_from(KEY_OBJECTS), min_size=1, max_size=4))
    values, pairs = [], []
    for k in keys:
        if form == "nested" and draw(st.booleans()):
            arrays = draw(st.lists(make(k), min_size=1, max_size=3))
            values.append(arrays)
            pairs += [(k, a) for a in arrays]
        else:
            a = draw(make(k))
            values.append(a)
            pairs.append((k, a))
    return keys, values, keys, pairs


@st.composite
def init_args(draw):
    """An init's keys and values: one key and its array, or lists (a key repeated in
    the list is an error)."""
    if draw(st.booleans()):
        k = draw(st.sampled_from(KEY_OBJECTS))
        a = draw(an_array(k))
        return k, a, [(k, a)]
    keys = draw(st.lists(st.sampled_from(KEY_OBJECTS), min_size=1, max_size=3))
    values = [draw(an_array(k)) for k in keys]
    return keys, values, list(zip(keys, values))


@st.composite
def outs_for(draw, key_structure):
    """Outs (zeros) matching a call's keys: per key an array or a list of them."""
    if not isinstance(key_structure, list):
        if draw(st.booleans()):
            return zeros_for(key_structure)
        return [zeros_for(key_structure) for _ in range(draw(st.integers(1, 3)))]
    nested = draw(st.booleans())
    outs = []
    for k in key_structure:
        if nested and draw(st.booleans()):
            outs.append([zeros_for(k) for _ in range(draw(st.integers(1, 2)))])
        else:
            outs.append(zeros_for(k))
    return outs


@st.composite
def pull_keys(draw):
    if draw(st.booleans()):
        return draw(st.sampled_from(KEY_OBJECTS))
    return draw(st.lists(st.sampled_from(KEY_OBJECTS), min_size=1, max_size=4))


OPS = [
    "init",
    "broadcast",
    "push",
    "push",
    "bad_push",
    "pull",
    "pull",
    "pull_new",
    "pushpull",
    "pushpull_in_place",
    "push_async",
    "push_async",
    "pull_async",
    "pushpull_async",
    "result",
    "wait_all",
]


# ---------------------------------------------------------------- the runner


class Pending:
    """A non-blocking call's future, and what its outs must hold once it is done."""

    def __init__(self, future, error, outs, expected, what):
        self.future, self.error, self.outs, self.expected, self.what = future, error, outs, expected, what

    def settle(self, timeout=30):
        if self.error is None:
            assert self.future.result(timeout) is None, self.what
            check_outs(self.outs, self.expected, self.what)
        else:
            assert isinstance(self.future.exception(timeout), self.error), self.what
        assert self.future.done()


def scribble(structure):
    """Overwrites a call's values once the call has copied them."""
    for a in flat(structure):
        a[...] = 99


def expect_error(error, fn):
    """Runs `fn`: it must raise `error` (a class) or, if `error` is None, succeed."""
    if error is None:
        fn()
    else:
        with pytest.raises(error):
            fn()


def run_sequence(data, updater, steps):
    store = kv.create(data.draw(st.sampled_from(["local", "device"]), label="kind"))
    try:
        _run_sequence(store, data, updater, steps)
    finally:
        # Never drop a store with calls in flight (see test_regressions.py).
        store.wait_all()


def _run_sequence(store, data, updater, steps):
    model = Model(updater)
    calls = []
    if updater:

        def add_twice(key, recv, stored):
            calls.append((key, recv.copy()))
            stored += recv * 2

        store.set_updater(add_twice)
    pending = []
    for step in range(steps):
        op = data.draw(st.sampled_from(OPS), label=f"op {step}")
        what = f"step {step}: {op}"
        if op in ("init", "broadcast"):
            keys, values, pairs = data.draw(init_args(), label="init")
            error = model.init(pairs)
            if op == "init":
                expect_error(error, lambda: store.init(keys, values))
            else:
                outs = data.draw(outs_for(keys), label="outs")
                expect_error(error, lambda: store.broadcast(keys, values, out=outs))
                if error is None:
                    check_outs(flat(outs), model.expected_outs(keys, outs), what)
        elif op == "push":
            keys, values, call_keys, pairs = data.draw(key_and_values(), label="push")
            before, model_before = len(calls), len(model.calls)
            error = model.push(call_keys, pairs)
            expect_error(error, lambda: store.push(keys, values))
            if updater and not pending:
                # Nothing else in flight: this push's updates, in first-init order.
                assert [k for k, _ in calls[before:]] == [k for k, _ in model.calls[model_before:]], what
        elif op == "bad_push":
            # One value of the wrong shape: the whole call fails and changes nothing.
            keys, values, call_keys, pairs = data.draw(key_and_values(allow_empty=False), label="push")
            victim = data.draw(st.integers(0, len(pairs) - 1), label="victim")
            bad = data.draw(an_array(pairs[victim][0], wrong_shape=True), label="bad")
            if isinstance(values, list):
                flat_values = flat(values)
                target = flat_values[victim]
                values = _replace(values, target, bad)
            else:
                values = bad
            error = kv.KeyNotInitializedError if model.missing(call_keys) else kv.ShapeMismatchError
            with pytest.raises((kv.ShapeMismatchError, kv.KeyNotInitializedError)) as e:
                store.push(keys, values)
            if not model.missing(call_keys):
                assert isinstance(e.value, error), what
        elif op in ("pull", "pull_async"):
            keys = data.draw(pull_keys(), label="keys")
            outs = data.draw(outs_for(keys), label="outs")
            missing = model.missing(flat(keys))
            expected = None if missing else model.expected_outs(keys, outs)
            if op == "pull":
                expect_error(kv.KeyNotInitializedError if missing else None, lambda: store.pull(keys, out=outs))
                if not missing:
                    check_outs(flat(outs), expected, what)
            else:
                fut = store.pull_async(keys, out=outs)
                error = kv.KeyNotInitializedError if missing else None
                pending.append(Pending(fut, error, flat(outs), expected, what))
        elif op == "pull_new":
            keys = data.draw(pull_keys(), label="keys")
            if model.missing(flat(keys)):
                with pytest.raises(kv.KeyNotInitializedError):
                    store.pull(keys)
            else:
                got = store.pull(keys)
                got = got if isinstance(keys, list) else [got]
                check_outs(got, [model.values[norm(k)] for k in flat(keys)], what)
        elif op in ("pushpull", "pushpull_async"):
            keys, values, call_keys, pairs = data.draw(key_and_values(allow_empty=False), label="pushpull")
            outs = data.draw(outs_for(keys), label="outs")
            error = model.push(call_keys, pairs)
            expected = None if error else model.expected_outs(keys, outs)
            if op == "pushpull":
                expect_error(error, lambda: store.pushpull(keys, values, out=outs))
                if error is None:
                    check_outs(flat(outs), expected, what)
            else:
                copy = data.draw(st.booleans(), label="copy")
                fut = store.pushpull_async(keys, values, out=outs, copy=copy)
                if copy:
                    scribble(values)
                pending.append(Pending(fut, error, flat(outs), expected, what))
        elif op == "pushpull_in_place":
            keys, values, call_keys, pairs = data.draw(key_and_values(allow_empty=False), label="pushpull")
            error = model.push(call_keys, pairs)
            if error is None:
                expected = model.expected_outs(keys, values)
            if data.draw(st.booleans(), label="async"):
                fut = store.pushpull_async(keys, values)
                pending.append(Pending(fut, error, flat(values), expected if error is None else None, what))
            else:
                expect_error(error, lambda: store.pushpull(keys, values))
                if error is None:
                    check_outs(flat(values), expected, what)
        elif op == "push_async":
            keys, values, call_keys, pairs = data.draw(key_and_values(), label="push")
            error = model.push(call_keys, pairs)
            copy = data.draw(st.booleans(), label="copy")
            fut = store.push_async(keys, values, copy=copy)
            if copy:
                scribble(values)
            pending.append(Pending(fut, error, [], [], what))
        elif op == "result":
            if pending:
                i = data.draw(st.integers(0, len(pending) - 1), label="which")
                pending.pop(i).settle()
        elif op == "wait_all":
            store.wait_all()
            for p in pending:
                assert p.future.done(), p.what
                p.settle(0)
            pending.clear()
    store.wait_all()
    for p in pending:
        p.settle(0)
    # The store holds the model's values, and the updater saw the model's calls.
    for n, want in model.values.items():
        check_outs([store.pull(n)], [want], f"final value of {n}")
    assert store.keys() == [model.key_object[n] for n in model.order]
    if updater:
        # Per key, in the order of the calls (non-blocking calls on different keys
        # may run in either order; within one push the order is checked in
        # test_conformance's case 9).
        for n in model.order:
            got = [(k, r) for k, r in calls if norm(k) == n]
            want = [(k, r) for k, r in model.calls if norm(k) == n]
            assert [k for k, _ in got] == [k for k, _ in want], n
            assert all(type(k) is type(w) for (k, _), (w, _) in zip(got, want)), n
            check_outs([r for _, r in got], [r for _, r in want], f"updater recv of {n}")
        assert len(calls) == len(model.calls)


def _replace(structure, target, new):
    if isinstance(structure, list):
        return [_replace(s, target, new) for s in structure]
    return new if structure is target else structure


@settings(max_examples=150, **SETTINGS)
@given(st.data())
def test_random_calls_match_the_model_with_assignment(data):
    run_sequence(data, updater=False, steps=30)


@settings(max_examples=80, **SETTINGS)
@given(st.data())
def test_random_calls_match_the_model_with_an_updater(data):
    run_sequence(data, updater=True, steps=30)


# ---------------------------------------------------------------- threads

THREADS = 4
OPS_PER_THREAD = 300


def test_threads_on_their_own_keys_and_one_shared_key():
    """Each thread runs its own random calls on its own keys (checked against its own
    model at every pull), and pushes known values to one shared key; the updater adds
    pushes to the shared key and assigns the others, so the shared key ends at the
    total of every thread's pushes."""
    store = kv.create("local")

    def updater(key, recv, stored):
        if key == "shared":
            stored += recv
        else:
            stored[...] = recv

    store.set_updater(updater)
    store.init("shared", np.zeros(8, dtype=np.int64))
    start = threading.Barrier(THREADS)
    errors = []
    totals = [0] * THREADS

    def work(t):
        try:
            rng = np.random.default_rng(1000 + t)
            keys = [f"t{t}.{i}" for i in range(3)] + [t * 100 + 7]
            shapes = {k: (int(rng.integers(1, 6)),) for k in keys}
            model = {k: np.zeros(shapes[k], np.float32) for k in keys}
            store.init(keys, [model[k].copy() for k in keys])
            start.wait()
            futures = []
            for i in range(OPS_PER_THREAD):
                k = keys[int(rng.integers(len(keys)))]
                n = int(rng.integers(1, 4))
                vals = [rng.integers(-9, 10, size=shapes[k]).astype(np.float32) for _ in range(n)]
                op = int(rng.integers(6))
                if op == 0:
                    store.push(k, vals)
                    model[k] = sum(vals[1:], vals[0].copy())
                elif op == 1:
                    out = np.zeros(shapes[k], np.float32)
                    store.pull(k, out=out)
                    assert (out == model[k]).all(), (t, i, k)
                elif op == 2:
                    out = np.zeros(shapes[k], np.float32)
                    store.pushpull(k, vals, out=out)
                    model[k] = sum(vals[1:], vals[0].copy())
                    assert (out == model[k]).all(), (t, i, k)
                elif op == 3:
                    want = sum(vals[1:], vals[0].copy())
                    futures.append((store.push_async(k, vals), None, None))
                    for v in vals:
                        v[...] = 55  # copied at the call
                    model[k] = want
                elif op == 4:
                    out = np.zeros(shapes[k], np.float32)
                    futures.append((store.pull_async(k, out=out), out, model[k].copy()))
                else:
                    v = np.full(8, t + 1, dtype=np.int64) * (i + 1)
                    totals[t] += int(v[0])
                    if rng.integers(2):
                        store.push("shared", v)
                    else:
                        futures.append((store.push_async("shared", v), None, None))
                if futures and rng.integers(4) == 0:
                    fut, out, want = futures.pop(int(rng.integers(len(futures))))
                    fut.result(30)
                    if out is not None:
                        assert (out == want).all(), (t, i)
            for fut, out, want in futures:
                fut.result(30)
                if out is not None:
                    assert (out == want).all(), t
            for k in keys:
                assert (store.pull(k) == model[k]).all(), (t, k)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append((t, e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    store.wait_all()
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors
    assert (store.pull("shared") == sum(totals)).all()
    assert sum(totals) > 0
