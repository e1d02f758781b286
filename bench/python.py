#!/usr/bin/env python3
"""`make bench`'s Python rows (DESIGN §9): kvstore from Python with numpy arrays, and
MXNet 1.9.1's own store (`mx.kv.create('local')`, mx.nd arrays) on the same sizes,
timed in this one process: the two stores in turn (kvstore first in even runs, MXNet
first in odd ones), medians of many runs after warm-ups (time.perf_counter). The rows
set against Rust rows are timed as those are: the big push and pull in turn (the Rust
ones alternate with plain loops), the small keys alone, call after call.

    python.py OUT_JSON

Writes OUT_JSON as the report's rows (name, median_s, limit_s); the report
(kvstore-core/benches/report.rs) sets each `python:` row against its Rust row timed in
the same `make bench`, and each `vs MXNet` row (kvstore's time, limit_s = MXNet's: the
ratio is how many times faster kvstore is) against its target. Without MXNet (not
importable) its rows print SKIP and the kvstore rows are still written.
KVSTORE_BENCH_RUNS sets the runs per row (default 21), as for the report.
"""
import json
import os
import sys
import time

import numpy as np

import kvstore
from kvstore import _kvstore

BIG = 4 << 20  # 4 Mi f32 = 16 MiB per array, the report's
D = 4  # values per push, outs per pull
SMALL_KEYS = 1000
SMALL = 1 << 10  # 1 Ki f32
REPS = 20_000  # push+pull pairs per timed run of the small row, as the Rust row


def median(t):
    t = sorted(t)
    return t[len(t) // 2]


def seconds(f):
    s = time.perf_counter()
    f()
    return time.perf_counter() - s


def medians_in_turn(warm, runs, a, b):
    """Medians of `runs` timings each of `a` and `b` (b may be None), in turn: a first in
    even runs, b first in odd ones, after `warm` untimed calls of each."""
    for _ in range(warm):
        a()
        if b:
            b()
    ta, tb = [], []
    for run in range(runs):
        if b is None:
            ta.append(seconds(a))
        elif run % 2 == 0:
            ta.append(seconds(a))
            tb.append(seconds(b))
        else:
            tb.append(seconds(b))
            ta.append(seconds(a))
    return median(ta), (median(tb) if b else None)


def medians_in_blocks(blocks, per_block, a, b):
    """Medians of timings of `a` and of `b`, each run in its own loop: `blocks` rounds of
    `per_block` calls of a, then of b (b first in odd rounds), the first call of each
    block untimed. Each store is timed in its steady state, as a training loop runs it,
    not right after the other one evicted its memory from the caches."""
    ta, tb = [], []
    for block in range(blocks):
        for f, t in ((a, ta), (b, tb)) if block % 2 == 0 else ((b, tb), (a, ta)):
            f()
            t.extend(seconds(f) for _ in range(per_block))
    return median(ta), median(tb)


def medians_against_rust(warm, runs, py_call, rust_call):
    """Medians of `runs` timings of `py_call` (timed here) and of `rust_call` (which
    returns the seconds its call from Rust took), in turn, Python first in even runs."""
    for _ in range(warm):
        py_call()
        rust_call()
    tp, tr = [], []
    for run in range(runs):
        if run % 2 == 0:
            tp.append(seconds(py_call))
            tr.append(rust_call())
        else:
            tr.append(rust_call())
            tp.append(seconds(py_call))
    return median(tp), median(tr)


def gluon_steps(mx, runs):
    """Medians of one gluon training step (forward and backward on 2 cpu contexts, then
    Trainer.step with SGD and momentum) of the same MLP (784-512-512-10, batch 128)
    through this store (kvstore.mxnet, `device`) and through MXNet's own `device`
    store, in turn. Both nets start from the same weights and see the same data; the
    weights they end with are checked equal."""
    import kvstore.mxnet as kvmx
    from mxnet import autograd, gluon

    ctxs = [mx.cpu(0), mx.cpu(1)]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 784)).astype(np.float32)
    y = rng.integers(0, 10, 128).astype(np.float32)
    xs = [mx.nd.array(x[i::2], ctx=c) for i, c in enumerate(ctxs)]
    ys = [mx.nd.array(y[i::2], ctx=c) for i, c in enumerate(ctxs)]
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def net_and_trainer(kv):
        mx.random.seed(7)
        net = gluon.nn.Sequential()
        net.add(
            gluon.nn.Dense(512, activation="relu", in_units=784),
            gluon.nn.Dense(512, activation="relu", in_units=512),
            gluon.nn.Dense(10, in_units=512),
        )
        net.initialize(mx.init.Xavier(), ctx=ctxs)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9}, kvstore=kv)

        def step():
            with autograd.record():
                losses = [loss_fn(net(a), b) for a, b in zip(xs, ys)]
            for l in losses:
                l.backward()
            trainer.step(128)
            mx.nd.waitall()

        return net, step

    ours_net, ours = net_and_trainer(kvmx.create("device"))
    native_net, native = net_and_trainer(kvmx.native_create("device"))
    ours_s, native_s = medians_in_turn(3, runs, ours, native)
    for (_, a), (_, b) in zip(ours_net.collect_params().items(), native_net.collect_params().items()):
        assert np.array_equal(a.data(ctxs[0]).asnumpy(), b.data(ctxs[0]).asnumpy()), "gluon: the two stores' weights differ"
    return ours_s, native_s


def filled(n, v):
    """The report's arrays: v + (i % 7)."""
    return (np.arange(n, dtype=np.int64) % 7).astype(np.float32) + np.float32(v)


def main() -> int:
    out_json = sys.argv[1]
    runs = int(os.environ.get("KVSTORE_BENCH_RUNS", "21"))
    try:
        import mxnet as mx
    except ImportError as e:
        mx = None
        print(f"SKIP: MXNet is not importable ({e}): its rows are not timed")
    mx_version = mx.__version__ if mx else None
    mxname = f"mxnet {mx_version}"
    rows = []  # (name, median_s, limit_s)
    kv = kvstore.create("local")
    mkv = mx.kv.create("local") if mx else None

    # ---- one big key: push of 4 values, pull into 4 outs ----
    ins = [filled(BIG, k) for k in range(D)]
    outs = [np.zeros(BIG, np.float32) for _ in range(D)]
    kv.init("big", ins[0])
    if mx:
        mins = [mx.nd.array(ins[k], ctx=mx.cpu(k), dtype="float32") for k in range(D)]
        mouts = [mx.nd.zeros(BIG, ctx=mx.cpu(k), dtype="float32") for k in range(D)]
        mkv.init("big", mins[0])
        mx.nd.waitall()

        def mx_push():
            mkv.push("big", mins)
            mx.nd.waitall()

        def mx_pull():
            mkv.pull("big", out=mouts)
            mx.nd.waitall()
    else:
        mx_push = mx_pull = None
    push_s, mx_push_s = medians_in_turn(3, runs, lambda: kv.push("big", ins), mx_push)
    pull_s, mx_pull_s = medians_in_turn(3, runs, lambda: kv.pull("big", out=outs), mx_pull)
    want = ins[0] + ins[1] + ins[2] + ins[3]
    assert all(np.array_equal(o, want) for o in outs), "kvstore: the pulled sum is wrong"
    if mx:
        assert all(np.array_equal(o.asnumpy(), want) for o in mouts), "MXNet: the pulled sum is wrong"
    rows.append(("python: push 4 x 4 Mi f32", push_s, None))
    rows.append(("python: pull 4 Mi f32 into 4 outs", pull_s, None))
    # The same calls made from Rust on the same arrays, in turn with Python's, call by
    # call: what calling from Python costs, whatever the machine does meanwhile.
    for op, what, arrays, name in (
        ("push", "push 4 x 4 Mi f32", ins, "push"),
        ("pull", "pull 4 Mi f32 into 4 outs", outs, "pull"),
    ):
        call = (lambda: kv.push("big", ins)) if op == "push" else (lambda: kv.pull("big", out=outs))
        py_s, rust_s = medians_against_rust(3, runs, call, lambda: _kvstore._time_calls_from_rust(kv, op, "big", arrays, 1)[0])
        rows.append((f"python: {what} (against the same call from Rust, in turn)", py_s, rust_s))
    if mx:
        rows.append((f"{mxname}: push 4 x 4 Mi f32 (mx.nd, waitall)", mx_push_s, None))
        rows.append((f"{mxname}: pull 4 Mi f32 into 4 outs (mx.nd, waitall)", mx_pull_s, None))
        rows.append((f"python: kvstore vs MXNet {mx_version}, push 4 x 4 Mi f32", push_s, mx_push_s))
        rows.append((f"python: kvstore vs MXNet {mx_version}, pull 4 Mi f32 into 4 outs", pull_s, mx_pull_s))
    del ins, outs, want
    if mx:
        del mins, mouts

    # ---- 1000 small keys: a list push of 4 values each, then a list pull ----
    keys = [f"k{i}" for i in range(SMALL_KEYS)]
    svals = [[np.full(SMALL, k, np.float32) for k in range(D)] for _ in range(SMALL_KEYS)]
    souts = [np.zeros(SMALL, np.float32) for _ in range(SMALL_KEYS)]
    kv.init(keys, souts)

    def small():
        kv.push(keys, svals)
        kv.pull(keys, out=souts)

    if mx:
        msvals = [
            [mx.nd.full(SMALL, k, ctx=mx.cpu(k), dtype="float32") for k in range(D)] for _ in range(SMALL_KEYS)
        ]
        msouts = [mx.nd.zeros(SMALL, dtype="float32") for _ in range(SMALL_KEYS)]
        mkv.init(keys, msouts)
        mx.nd.waitall()

        def mx_small():
            mkv.push(keys, msvals)
            mkv.pull(keys, out=msouts)
            mx.nd.waitall()
    else:
        mx_small = None
    # Against MXNet: in turn. Against the Rust row (timed alone, call after call): alone.
    small_in_turn_s, mx_small_s = medians_in_turn(3, runs, small, mx_small)
    small_s, _ = medians_in_turn(3, runs, small, None)
    assert all((o == 6.0).all() for o in souts), "kvstore: the small keys' sums are wrong"
    if mx:
        assert all((o.asnumpy() == 6.0).all() for o in msouts), "MXNet: the small keys' sums are wrong"
    per = SMALL_KEYS
    rows.append(("python: 1000 keys x 1 Ki f32 x 4, list push + list pull (per key)", small_s / per, None))
    if mx:
        rows.append((f"{mxname}: 1000 keys x 1 Ki f32 x 4, list push + list pull (per key)", mx_small_s / per, None))
        name = f"python: kvstore vs MXNet {mx_version}, 1000 keys x 1 Ki f32 x 4 (per key, in turn)"
        rows.append((name, small_in_turn_s / per, mx_small_s / per))
        # The same, each store in its own loop (blocks of calls, alternated).
        blocks_s, mx_blocks_s = medians_in_blocks(6, max(3, runs // 3), small, mx_small)
        name = f"python: kvstore vs MXNet {mx_version}, 1000 keys x 1 Ki f32 x 4 (per key, each in its own loop)"
        rows.append((name, blocks_s / per, mx_blocks_s / per))

    # ---- the MXNet drop-in: a gluon Trainer step through each store ----
    if mx:
        ours_s, native_s = gluon_steps(mx, runs)
        rows.append((f"{mxname}: gluon Trainer step, MLP on 2 cpu contexts, native device store", native_s, None))
        name = f"python: kvstore.mxnet vs MXNet {mx_version}'s device store, gluon Trainer step (in turn)"
        rows.append((name, ours_s, native_s))

    # ---- one small key: a blocking push, then a pull (the Rust row's calls) ----
    one = np.ones(SMALL, np.float32)
    one_out = np.zeros(SMALL, np.float32)
    kv.init("s", one)

    def pairs():
        for _ in range(REPS):
            kv.push("s", one)
            kv.pull("s", out=one_out)

    pair_s, _ = medians_in_turn(1, runs, pairs, None)
    assert (one_out == 1.0).all(), "kvstore: the small key is wrong"
    rows.append(("python: push+pull 1 Ki f32", pair_s / REPS, None))

    with open(out_json, "w") as f:
        json.dump([{"name": n, "median_s": m, "limit_s": lim} for n, m, lim in rows], f, indent=1)
    for n, m, lim in rows:
        ratio = f"{lim / m:.2f}" if lim else ""
        t = f"{m * 1e6:.2f} us" if m < 1e-3 else f"{m * 1e3:.3f} ms"
        print(f"{n:<76} {t:>12} {ratio:>7}")
    print(f"wrote {out_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
