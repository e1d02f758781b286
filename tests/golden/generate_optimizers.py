#!/usr/bin/env python3
"""Golden cases for the optimizers: runs Apache MXNet 1.9.1's Python optimizers on a
``local`` KVStore (``kv.set_optimizer(opt)``) and records every pulled weight as JSON,
so that the Rust tests (``tests/tests/optimizers.rs``) replay the same pushes through
``Optimizer::builder(..)`` and compare, without MXNet.

Every optimizer of the registry that the Rust store implements is run with every
hyper-parameter set explicitly (non-default ``learning_rate``, ``wd``,
``rescale_grad``, ``clip_gradient`` and its own parameters); some cases add an lr
scheduler of each kind (factor, multifactor, poly, cosine) with a linear or constant
warm-up, ``lr_mult``/``wd_mult`` for one key, ``begin_num_update``, float16 weights
with ``multi_precision=True`` (sgd, adam) and float64 weights (adam, nadam).

Each case: a fresh ``mx.kv.create('local')``; ``init`` of 2-3 string keys with
deterministic float weights; ``set_optimizer``; then 5 steps, each a single ``push`` of
a list of keys (one gradient per key, or two gradients on cpu(0) and cpu(1) that the
store sums first; some steps push only some keys, so that the per-key update counts
differ); after every step every key is pulled.

How to run (from the repository root):

    python3 -m venv target/mxnet-venv
    target/mxnet-venv/bin/pip install mxnet==1.9.1 'numpy<1.24'
    target/mxnet-venv/bin/python tests/golden/generate_optimizers.py tests/golden/mxnet_optimizers.json

The output is deterministic (run it twice: identical bytes), except that SGLD adds
MXNet's unseeded Gaussian noise; its case is seeded here (``mx.random.seed``) so the
file is still reproducible, and the Rust side checks it statistically.

Not recorded, because MXNet 1.9.1 fails there: ``dcasgd`` with ``momentum > 0`` (its
Python ``update`` evaluates ``if mom:`` on an NDArray, which raises for more than one
element, and fails an assertion for one element; the exception is swallowed by the
kvstore callback and the weight is left unchanged).

JSON format: see ``tests/golden/README.md``.
"""

import contextlib
import json
import sys

import numpy as np
import mxnet as mx

MXNET_VERSION = "1.9.1"
GENERATOR = "tests/golden/generate_optimizers.py"
KEYS = [("w0", (2, 3)), ("w1", (4,)), ("b", (2, 2))]
STEPS = 5
# Per step: which keys are pushed, and how many values each (1: one array; 2: two
# arrays on cpu(0) and cpu(1) that the store sums).
DEFAULT_PLAN = [
    (["w0", "w1", "b"], 1),
    (["w0", "w1", "b"], 2),
    (["w0", "b"], 1),
    (["w1", "b", "w0"], 1),
    (["w0", "w1"], 2),
]
BOOL_PARAMS = {"centered", "bias_correction", "momentum_correction", "multi_precision", "lazy_update"}
# Parameters MXNet takes as strings, recorded as their code (an index here; the Rust
# side takes the code): LBSGD's warm-up, with "constant" for any other name.
STRING_PARAMS = {"warmup_strategy": ["linear", "power2", "sqrt", "lars", "constant"]}


def flat(a):
    """Row-major list of Python floats (exact for float16/32/64)."""
    return [float(x) for x in np.asarray(a).reshape(-1)]


def make_scheduler(spec):
    if spec is None:
        return None
    kind = spec["type"]
    warm = dict(warmup_steps=spec["warmup_steps"], warmup_begin_lr=spec["warmup_begin_lr"],
                warmup_mode=spec["warmup_mode"])
    if kind == "factor":
        return mx.lr_scheduler.FactorScheduler(step=spec["step"], factor=spec["factor"],
                                               stop_factor_lr=spec["stop_factor_lr"],
                                               base_lr=spec["base_lr"], **warm)
    if kind == "multifactor":
        return mx.lr_scheduler.MultiFactorScheduler(step=list(spec["step"]), factor=spec["factor"],
                                                    base_lr=spec["base_lr"], **warm)
    if kind == "poly":
        return mx.lr_scheduler.PolyScheduler(max_update=spec["max_update"], base_lr=spec["base_lr"],
                                             pwr=spec["pwr"], final_lr=spec["final_lr"], **warm)
    if kind == "cosine":
        return mx.lr_scheduler.CosineScheduler(max_update=spec["max_update"], base_lr=spec["base_lr"],
                                               final_lr=spec["final_lr"], **warm)
    raise ValueError(kind)


def run_case(case):
    name = case["name"]
    dtype = case.get("dtype", "float32")
    keys = case.get("keys", KEYS)
    plan = case.get("plan", DEFAULT_PLAN)
    seed = case["seed"]
    rng = np.random.RandomState(seed)
    if "mx_seed" in case:
        mx.random.seed(case["mx_seed"])

    kwargs = {}
    for k, v in case["params"].items():
        if k in STRING_PARAMS:
            kwargs[k] = STRING_PARAMS[k][v]
        else:
            kwargs[k] = bool(v) if k in BOOL_PARAMS else v
    sched = make_scheduler(case.get("scheduler"))
    if sched is not None:
        kwargs["lr_scheduler"] = sched
    opt = mx.optimizer.create(case["optimizer"], **kwargs)
    if case.get("lr_mult"):
        opt.set_lr_mult(dict(case["lr_mult"]))
    if case.get("wd_mult"):
        opt.set_wd_mult(dict(case["wd_mult"]))

    kv = mx.kv.create("local")
    init = {}
    for k, shape in keys:
        init[k] = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32).astype(dtype)
    kv.init([k for k, _ in keys], [mx.nd.array(init[k], dtype=dtype) for k, _ in keys])
    kv.set_optimizer(opt)

    shapes = dict(keys)
    steps = []
    for pushed, nvals in plan:
        push = []
        flat_keys, flat_vals = [], []
        for k in pushed:
            values = []
            for c in range(nvals):
                g = (rng.standard_normal(size=shapes[k]) * case.get("grad_scale", 1.0))
                g = g.astype(np.float32).astype(dtype)
                values.append({"ctx": c, "data": flat(g)})
                flat_keys.append(k)
                flat_vals.append(mx.nd.array(g, ctx=mx.cpu(c), dtype=dtype))
            push.append({"key": k, "values": values})
        kv.push(flat_keys, flat_vals)
        outs = [mx.nd.zeros(shapes[k], dtype=dtype) for k, _ in keys]
        kv.pull([k for k, _ in keys], out=outs)
        mx.nd.waitall()
        pulled = {k: flat(o.asnumpy()) for (k, _), o in zip(keys, outs)}
        # MXNet swallows exceptions raised in the updater callback (it prints them and
        # leaves the weight as it was): a pushed key whose weight did not move means
        # the optimizer failed, which must not be recorded as golden.
        before = steps[-1]["pull"] if steps else {k: flat(init[k]) for k, _ in keys}
        for k in pushed:
            # (LBSGD moves a weight only on the push that completes its batch.)
            if not case.get("batches"):
                assert pulled[k] != before[k], "%s: key %s did not change" % (name, k)
        steps.append({"push": push, "pull": pulled})

    out = {
        "name": name,
        "optimizer": case["optimizer"],
        "params": case["params"],
        "scheduler": case.get("scheduler"),
        "lr_mult": case.get("lr_mult", {}),
        "wd_mult": case.get("wd_mult", {}),
        "dtype": dtype,
        "keys": [{"key": k, "shape": list(shape), "init": flat(init[k])} for k, shape in keys],
        "steps": steps,
    }
    if "note" in case:
        out["note"] = case["note"]
    return out


def sched(kind, **kw):
    base = {"type": kind, "warmup_steps": 0, "warmup_begin_lr": 0.0, "warmup_mode": "linear"}
    base.update(kw)
    return base


CASES = [
    # --- sgd (multi_sgd_update / multi_sgd_mom_update: SGD aggregates) ---
    dict(name="sgd_momentum_factor_warmup_mults", optimizer="sgd", seed=1,
         params={"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01, "rescale_grad": 0.5,
                 "clip_gradient": 0.8, "lazy_update": 1, "multi_precision": 0, "begin_num_update": 0},
         scheduler=sched("factor", step=2, factor=0.5, stop_factor_lr=0.02, base_lr=0.3,
                         warmup_steps=2, warmup_begin_lr=0.05, warmup_mode="linear"),
         lr_mult={"w1": 0.5}, wd_mult={"b": 0.0}),
    dict(name="sgd_plain_multifactor_clip0", optimizer="sgd", seed=2,
         note="clip_gradient=0 is falsy: the Python does not pass it, so no clipping",
         params={"learning_rate": 0.05, "momentum": 0.0, "wd": 0.02, "rescale_grad": 2.0,
                 "clip_gradient": 0.0, "lazy_update": 0, "multi_precision": 0, "begin_num_update": 0},
         scheduler=sched("multifactor", step=[1, 3], factor=0.7, base_lr=0.05,
                         warmup_steps=0, warmup_begin_lr=0.0, warmup_mode="linear")),
    dict(name="sgd_momentum_f16_multi_precision", optimizer="sgd", seed=3, dtype="float16",
         params={"learning_rate": 0.1, "momentum": 0.8, "wd": 0.01, "rescale_grad": 0.5,
                 "clip_gradient": 1.5, "lazy_update": 1, "multi_precision": 1, "begin_num_update": 0}),
    # The multi-tensor kernels compute (lr * rescale_grad) * grad when they do not clip:
    # a rescale that is not a power of two shows the order in the last bit.
    dict(name="sgd_momentum_rescale_not_a_power_of_two", optimizer="sgd", seed=30,
         params={"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01, "rescale_grad": 1.0 / 12,
                 "clip_gradient": 0.0, "lazy_update": 1, "multi_precision": 0, "begin_num_update": 0},
         keys=[("w0", (40, 25)), ("w1", (300,)), ("b", (2, 2))]),
    dict(name="sgd_plain_rescale_not_a_power_of_two", optimizer="sgd", seed=31,
         params={"learning_rate": 0.07, "momentum": 0.0, "wd": 0.01, "rescale_grad": 1.0 / 12,
                 "clip_gradient": 0.0, "lazy_update": 1, "multi_precision": 0, "begin_num_update": 0},
         keys=[("w0", (40, 25)), ("w1", (300,)), ("b", (2, 2))]),
    # --- nag (nag_mom_update; sgd_update without momentum) ---
    dict(name="nag_momentum_poly_warmup", optimizer="nag", seed=4,
         params={"learning_rate": 0.1, "momentum": 0.9, "wd": 0.05, "rescale_grad": 0.5,
                 "clip_gradient": 0.6, "multi_precision": 0, "begin_num_update": 0},
         scheduler=sched("poly", max_update=8, pwr=2.0, final_lr=0.001, base_lr=0.2,
                         warmup_steps=2, warmup_begin_lr=0.01, warmup_mode="linear"),
         lr_mult={"b": 2.0}),
    dict(name="nag_no_momentum", optimizer="nag", seed=5,
         params={"learning_rate": 0.2, "momentum": 0.0, "wd": 0.03, "rescale_grad": 1.5,
                 "clip_gradient": 1.0, "multi_precision": 0, "begin_num_update": 0}),
    # --- adam ---
    dict(name="adam_cosine_constant_warmup", optimizer="adam", seed=6,
         params={"learning_rate": 0.05, "beta1": 0.8, "beta2": 0.95, "epsilon": 1e-6, "wd": 0.01,
                 "rescale_grad": 0.5, "clip_gradient": 0.7, "lazy_update": 1,
                 "multi_precision": 0, "begin_num_update": 0},
         scheduler=sched("cosine", max_update=6, final_lr=0.005, base_lr=0.08,
                         warmup_steps=2, warmup_begin_lr=0.02, warmup_mode="constant"),
         wd_mult={"w0": 3.0}),
    dict(name="adam_begin_num_update", optimizer="adam", seed=7,
         params={"learning_rate": 0.01, "beta1": 0.85, "beta2": 0.99, "epsilon": 1e-7, "wd": 0.0,
                 "rescale_grad": 1.0, "clip_gradient": 2.0, "lazy_update": 0,
                 "multi_precision": 0, "begin_num_update": 3}),
    dict(name="adam_f16_multi_precision", optimizer="adam", seed=8, dtype="float16",
         params={"learning_rate": 0.02, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-6, "wd": 0.01,
                 "rescale_grad": 0.5, "clip_gradient": 1.0, "lazy_update": 1,
                 "multi_precision": 1, "begin_num_update": 0}),
    dict(name="adam_f64", optimizer="adam", seed=9, dtype="float64",
         params={"learning_rate": 0.03, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "wd": 0.02,
                 "rescale_grad": 0.5, "clip_gradient": 0.9, "lazy_update": 1,
                 "multi_precision": 0, "begin_num_update": 0}),
    # --- adagrad (NDArray arithmetic in Python) ---
    dict(name="adagrad", optimizer="adagrad", seed=10,
         params={"learning_rate": 0.1, "eps": 1e-6, "wd": 0.02, "rescale_grad": 0.5,
                 "clip_gradient": 0.5, "multi_precision": 0, "begin_num_update": 0},
         lr_mult={"w0": 0.3}),
    dict(name="adagrad_clip0", optimizer="adagrad", seed=11,
         note="clip_gradient=0 is not None: AdaGrad clips every gradient to 0",
         params={"learning_rate": 0.1, "eps": 1e-7, "wd": 0.1, "rescale_grad": 1.0,
                 "clip_gradient": 0.0, "multi_precision": 0, "begin_num_update": 0}),
    # --- rmsprop ---
    dict(name="rmsprop_plain_clip_weights", optimizer="rmsprop", seed=12,
         params={"learning_rate": 0.01, "gamma1": 0.8, "gamma2": 0.7, "epsilon": 1e-6, "centered": 0,
                 "clip_weights": 0.9, "wd": 0.01, "rescale_grad": 0.5, "clip_gradient": 0.8,
                 "multi_precision": 0, "begin_num_update": 0}),
    dict(name="rmsprop_centered_clip_weights", optimizer="rmsprop", seed=13,
         params={"learning_rate": 0.02, "gamma1": 0.85, "gamma2": 0.75, "epsilon": 1e-4, "centered": 1,
                 "clip_weights": 0.95, "wd": 0.02, "rescale_grad": 0.5, "clip_gradient": 1.2,
                 "multi_precision": 0, "begin_num_update": 0},
         scheduler=sched("factor", step=3, factor=0.5, stop_factor_lr=1e-8, base_lr=0.02,
                         warmup_steps=0, warmup_begin_lr=0.0, warmup_mode="linear")),
    # --- adadelta (lr unused) ---
    dict(name="adadelta", optimizer="adadelta", seed=14,
         params={"learning_rate": 0.5, "rho": 0.8, "epsilon": 1e-4, "wd": 0.02, "rescale_grad": 0.5,
                 "clip_gradient": 0.9, "multi_precision": 0, "begin_num_update": 0},
         wd_mult={"w1": 0.5}),
    # --- ftrl ---
    dict(name="ftrl", optimizer="ftrl", seed=15,
         params={"learning_rate": 0.2, "lamda1": 0.05, "beta": 0.5, "wd": 0.01, "rescale_grad": 0.5,
                 "clip_gradient": 1.1, "multi_precision": 0, "begin_num_update": 0},
         lr_mult={"w1": 0.5}),
    dict(name="ftrl_multifactor", optimizer="ftrl", seed=16,
         note="Ftrl does not pass learning_rate to Optimizer.__init__, so the schedule keeps "
              "its own base_lr; here it equals learning_rate",
         params={"learning_rate": 0.3, "lamda1": 0.2, "beta": 1.5, "wd": 0.0, "rescale_grad": 1.0,
                 "clip_gradient": 0.6, "multi_precision": 0, "begin_num_update": 0},
         scheduler=sched("multifactor", step=[2, 4], factor=0.5, base_lr=0.3,
                         warmup_steps=0, warmup_begin_lr=0.0, warmup_mode="linear")),
    # --- signum ---
    dict(name="signum_momentum_wd_lh", optimizer="signum", seed=17,
         params={"learning_rate": 0.02, "momentum": 0.7, "wd_lh": 0.05, "wd": 0.03,
                 "rescale_grad": 0.5, "clip_gradient": 0.4, "multi_precision": 0, "begin_num_update": 0},
         lr_mult={"w0": 2.0}),
    dict(name="signsgd_no_momentum", optimizer="signum", seed=18,
         params={"learning_rate": 0.03, "momentum": 0.0, "wd_lh": 0.0, "wd": 0.05,
                 "rescale_grad": 0.5, "clip_gradient": 0.4, "multi_precision": 0, "begin_num_update": 0}),
    # --- dcasgd (momentum 0 only: MXNet fails with momentum, see the docstring) ---
    dict(name="dcasgd", optimizer="dcasgd", seed=19,
         params={"learning_rate": 0.1, "momentum": 0.0, "lamda": 0.3, "wd": 0.02, "rescale_grad": 0.5,
                 "clip_gradient": 0.9, "multi_precision": 0, "begin_num_update": 0},
         wd_mult={"b": 0.0}),
    # --- adamax ---
    dict(name="adamax", optimizer="adamax", seed=20,
         params={"learning_rate": 0.01, "beta1": 0.8, "beta2": 0.9, "wd": 0.02, "rescale_grad": 0.5,
                 "clip_gradient": 0.9, "multi_precision": 0, "begin_num_update": 0},
         lr_mult={"b": 0.5},
         scheduler=sched("poly", max_update=10, pwr=1.0, final_lr=0.0, base_lr=0.01,
                         warmup_steps=3, warmup_begin_lr=0.002, warmup_mode="constant")),
    # --- nadam (global momentum schedule) ---
    dict(name="nadam", optimizer="nadam", seed=21,
         params={"learning_rate": 0.01, "beta1": 0.85, "beta2": 0.99, "epsilon": 1e-6,
                 "schedule_decay": 0.01, "wd": 0.02, "rescale_grad": 0.5, "clip_gradient": 0.8,
                 "multi_precision": 0, "begin_num_update": 0},
         scheduler=sched("cosine", max_update=5, final_lr=0.001, base_lr=0.02,
                         warmup_steps=2, warmup_begin_lr=0.005, warmup_mode="linear")),
    dict(name="nadam_f64", optimizer="nadam", seed=22, dtype="float64",
         params={"learning_rate": 0.02, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8,
                 "schedule_decay": 0.004, "wd": 0.01, "rescale_grad": 1.0, "clip_gradient": 1.5,
                 "multi_precision": 0, "begin_num_update": 0}),
    # --- lamb (multi_lamb_update: LAMB aggregates) ---
    dict(name="lamb_bias_correction_bounds", optimizer="lamb", seed=23,
         params={"learning_rate": 0.05, "beta1": 0.8, "beta2": 0.95, "epsilon": 1e-5,
                 "lower_bound": 0.5, "upper_bound": 1.2, "bias_correction": 1, "wd": 0.01,
                 "rescale_grad": 0.5, "clip_gradient": 0.9, "multi_precision": 0, "begin_num_update": 0},
         lr_mult={"w1": 0.5}),
    dict(name="lamb_no_bias_correction", optimizer="lamb", seed=24,
         params={"learning_rate": 0.02, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-6,
                 "bias_correction": 0, "wd": 0.05, "rescale_grad": 1.0, "clip_gradient": 2.0,
                 "multi_precision": 0, "begin_num_update": 0},
         scheduler=sched("factor", step=2, factor=0.8, stop_factor_lr=1e-8, base_lr=0.02,
                         warmup_steps=0, warmup_begin_lr=0.0, warmup_mode="linear")),
    # --- lars (multi_sum_sq + multi_lars + preloaded_multi_sgd*: LARS aggregates) ---
    dict(name="lars_momentum_correction_factor", optimizer="lars", seed=25,
         note="no lr_mult: with momentum_correction MXNet divides the scheduler's rates "
              "before lr_mult",
         params={"learning_rate": 0.5, "momentum": 0.9, "eta": 0.01, "eps": 1e-4,
                 "momentum_correction": 1, "lazy_update": 1, "wd": 0.01, "rescale_grad": 0.5,
                 "clip_gradient": 1.0, "multi_precision": 0, "begin_num_update": 0},
         scheduler=sched("factor", step=2, factor=0.5, stop_factor_lr=1e-8, base_lr=0.5,
                         warmup_steps=2, warmup_begin_lr=0.1, warmup_mode="linear")),
    dict(name="lars_no_momentum_mults", optimizer="lars", seed=26,
         params={"learning_rate": 0.3, "momentum": 0.0, "eta": 0.02, "eps": 0.0,
                 "momentum_correction": 0, "lazy_update": 1, "wd": 0.02, "rescale_grad": 2.0,
                 "clip_gradient": 0.0, "multi_precision": 0, "begin_num_update": 0},
         lr_mult={"w0": 0.5}, wd_mult={"b": 2.0}),
    # --- ftml (ftml_update: a fused kernel, t as the weight's type) ---
    dict(name="ftml_factor_mults", optimizer="ftml", seed=40,
         params={"learning_rate": 0.02, "beta1": 0.7, "beta2": 0.99, "epsilon": 1e-6, "wd": 0.02,
                 "rescale_grad": 0.5, "clip_gradient": 0.9, "multi_precision": 0, "begin_num_update": 0},
         scheduler=sched("factor", step=2, factor=0.5, stop_factor_lr=1e-8, base_lr=0.02,
                         warmup_steps=1, warmup_begin_lr=0.005, warmup_mode="linear"),
         lr_mult={"w1": 0.5}, wd_mult={"b": 0.0}),
    dict(name="ftml_defaults_clip0", optimizer="ftml", seed=41,
         note="clip_gradient=0 is falsy: the Python does not pass it, so no clipping",
         params={"learning_rate": 0.01, "beta1": 0.6, "beta2": 0.999, "epsilon": 1e-8, "wd": 0.0,
                 "rescale_grad": 1.0, "clip_gradient": 0.0, "multi_precision": 0, "begin_num_update": 3}),
    dict(name="ftml_f64", optimizer="ftml", seed=42, dtype="float64",
         params={"learning_rate": 0.05, "beta1": 0.5, "beta2": 0.9, "epsilon": 1e-7, "wd": 0.01,
                 "rescale_grad": 2.0, "clip_gradient": 1.5, "multi_precision": 0, "begin_num_update": 0}),
    # --- lbsgd (Python batching and warm-up, then sgd_update / sgd_mom_update; the rate
    # is read before the update is counted). The first push of each key has one value:
    # MXNet keeps the first gradient it sums by reference, and a merge buffer it reuses
    # would change under it.
    dict(name="lbsgd_linear_momentum_factor", optimizer="lbsgd", seed=50, batches=True,
         params={"learning_rate": 0.1, "momentum": 0.9, "warmup_strategy": 0, "warmup_epochs": 1,
                 "batch_scale": 2, "updates_per_epoch": 4, "begin_epoch": 0, "wd": 0.01,
                 "rescale_grad": 0.5, "clip_gradient": 0.8, "multi_precision": 0, "begin_num_update": 0},
         scheduler=sched("factor", step=1, factor=0.8, stop_factor_lr=1e-8, base_lr=0.1,
                         warmup_steps=0, warmup_begin_lr=0.0, warmup_mode="linear"),
         lr_mult={"w1": 0.5}),
    dict(name="lbsgd_lars_every_push", optimizer="lbsgd", seed=51,
         params={"learning_rate": 0.05, "momentum": 0.0, "warmup_strategy": 3, "warmup_epochs": 5,
                 "batch_scale": 1, "updates_per_epoch": 32, "begin_epoch": 0, "wd": 0.02,
                 "rescale_grad": 1.0, "clip_gradient": 0.0, "multi_precision": 0, "begin_num_update": 0},
         keys=[("w0", (40, 25)), ("w1", (300,)), ("b", (2, 2))]),
    dict(name="lbsgd_power2_batches_of_3", optimizer="lbsgd", seed=52, batches=True,
         params={"learning_rate": 0.2, "momentum": 0.5, "warmup_strategy": 1, "warmup_epochs": 2,
                 "batch_scale": 3, "updates_per_epoch": 2, "begin_epoch": 1, "wd": 0.0,
                 "rescale_grad": 2.0, "clip_gradient": 0.0, "multi_precision": 0, "begin_num_update": 2}),
    dict(name="lbsgd_sqrt_f64", optimizer="lbsgd", seed=53, dtype="float64", batches=True,
         params={"learning_rate": 0.1, "momentum": 0.0, "warmup_strategy": 2, "warmup_epochs": 3,
                 "batch_scale": 2, "updates_per_epoch": 1, "begin_epoch": 0, "wd": 0.05,
                 "rescale_grad": 1.0, "clip_gradient": 1.2, "multi_precision": 0, "begin_num_update": 0}),
    dict(name="lbsgd_other_strategy_lars_momentum", optimizer="lbsgd", seed=54, batches=True,
         note="warmup_strategy 4 stands for any other name (MXNet's multiplier is then 1)",
         params={"learning_rate": 0.1, "momentum": 0.7, "warmup_strategy": 4, "warmup_epochs": 1,
                 "batch_scale": 2, "updates_per_epoch": 1, "begin_epoch": 0, "wd": 0.01,
                 "rescale_grad": 1.0, "clip_gradient": 0.0, "multi_precision": 0, "begin_num_update": 0}),
    dict(name="lbsgd_lars_momentum_batches", optimizer="lbsgd", seed=55, batches=True,
         params={"learning_rate": 0.1, "momentum": 0.9, "warmup_strategy": 3, "warmup_epochs": 1,
                 "batch_scale": 2, "updates_per_epoch": 1, "begin_epoch": 0, "wd": 0.0,
                 "rescale_grad": 1.0, "clip_gradient": 0.0, "multi_precision": 0, "begin_num_update": 0},
         keys=[("w0", (20, 10)), ("w1", (9,)), ("b", (2, 2))]),
    # --- sgld: MXNet draws unseeded noise; recorded for a statistical check ---
    dict(name="sgld_statistical", optimizer="sgld", seed=27, mx_seed=42,
         keys=[("w", (32, 32))], plan=[(["w"], 1), (["w"], 2), (["w"], 1)],
         note="random: compare statistically (noise N(0, sqrt(lr)))",
         params={"learning_rate": 0.01, "wd": 0.1, "rescale_grad": 0.5, "clip_gradient": 1.0,
                 "multi_precision": 0, "begin_num_update": 0}),
]


def main():
    # Optimizer.__init__ prints a warning when learning_rate replaces a schedule's
    # base_lr: keep stdout for the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        cases = [run_case(c) for c in CASES]
    doc = {"mxnet_version": mx.__version__, "generator": GENERATOR, "cases": cases}
    assert mx.__version__ == MXNET_VERSION, mx.__version__
    text = json.dumps(doc, indent=None, separators=(",", ":"), sort_keys=False) + "\n"
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
