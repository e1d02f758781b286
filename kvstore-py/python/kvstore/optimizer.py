"""The store's optimizers, with MXNet's class names, registry names and
hyper-parameters (``mxnet.optimizer``)::

    from kvstore import optimizer
    kv.set_optimizer(optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-4))
    kv.set_optimizer(optimizer.create("adam", learning_rate=1e-3))

Every optimizer takes MXNet's common arguments: ``learning_rate``, ``wd``,
``rescale_grad``, ``clip_gradient``, ``lr_scheduler`` (a :mod:`kvstore.lr_scheduler`
schedule), ``multi_precision`` and ``begin_num_update``; and its own (``momentum``,
``beta1``, ...). The update runs in the store, in Rust, with the same results bit for
bit as from the Rust, Java and Clojure bindings. Arguments are checked when the
optimizer is made: an unknown name or a bad value raises
:class:`kvstore.InvalidArgumentError`.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Optional, Type

from . import _kvstore
from .errors import ArgumentTypeError
from .lr_scheduler import LRScheduler

__all__ = [
    "Optimizer",
    "SGD",
    "NAG",
    "Adam",
    "AdaGrad",
    "RMSProp",
    "AdaDelta",
    "Ftrl",
    "Signum",
    "SGLD",
    "DCASGD",
    "Adamax",
    "Nadam",
    "LAMB",
    "LARS",
    "FTML",
    "LBSGD",
    "create",
    "register",
]

# Arguments of MXNet's Optimizer that describe a symbol or parameter objects, not the
# update: accepted and ignored.
_IGNORED = ("sym", "param_idx2name", "param_dict")


# Hyper-parameters MXNet takes as names: (optimizer, parameter).
_NAMED_PARAMS = {("lbsgd", "warmup_strategy")}


class Optimizer:
    """An optimizer as the store runs it: a registry name and hyper-parameters.

    ``Optimizer("adam", learning_rate=0.01)`` is the same as ``Adam(learning_rate=0.01)``.
    ``set_lr_mult`` and ``set_wd_mult`` set per-key multipliers, as in MXNet.
    """

    name = ""

    def __init__(self, name: Optional[str] = None, **kwargs: Any) -> None:
        if name is not None:
            self.name = name.lower()
        if not self.name:
            raise ArgumentTypeError("Optimizer needs a name: Optimizer('sgd', ...), or use a subclass such as SGD")
        self.lr_scheduler: Optional[LRScheduler] = kwargs.pop("lr_scheduler", None)
        if self.lr_scheduler is not None and not isinstance(self.lr_scheduler, LRScheduler):
            raise ArgumentTypeError(
                f"lr_scheduler must be a kvstore.lr_scheduler schedule, not {type(self.lr_scheduler).__name__}"
            )
        for k in _IGNORED:
            kwargs.pop(k, None)
        params: Dict[str, Any] = {}
        for k, v in kwargs.items():
            if v is None:
                continue  # MXNet's "not set" (clip_gradient=None, ...)
            if isinstance(v, bool):
                params[k] = v
            elif isinstance(v, str) and (self.name, k) in _NAMED_PARAMS:
                params[k] = v  # the store reads the name (LBSGD's warmup_strategy)
            elif isinstance(v, (int, float)):
                params[k] = float(v)
            else:
                try:
                    params[k] = float(v)  # numpy scalars
                except (TypeError, ValueError):
                    raise ArgumentTypeError(f"{self.name}: {k} must be a number, not {type(v).__name__}") from None
        self.params = params
        self.lr_mult: Dict[str, float] = {}
        self.wd_mult: Dict[str, float] = {}
        self._check()

    @property
    def learning_rate(self) -> Optional[float]:
        """The learning rate given (``None``: the optimizer's default)."""
        return self.params.get("learning_rate")

    @property
    def wd(self) -> float:
        """The weight decay given (default 0)."""
        return float(self.params.get("wd", 0.0))

    def set_lr_mult(self, args_lr_mult: Dict[Any, float]) -> None:
        """Per-key learning-rate multipliers (keys as in the store)."""
        self.lr_mult = {str(k): float(v) for k, v in args_lr_mult.items()}
        self._check()

    def set_wd_mult(self, args_wd_mult: Dict[Any, float]) -> None:
        """Per-key weight-decay multipliers (keys as in the store)."""
        self.wd_mult = {str(k): float(v) for k, v in args_wd_mult.items()}
        self._check()

    def _json(self) -> str:
        """The store's JSON description of this optimizer."""
        return json.dumps(
            {
                "name": self.name,
                "params": {k: _number(v) for k, v in self.params.items()},
                "scheduler": self.lr_scheduler._spec() if self.lr_scheduler is not None else None,
                "lr_mult": {k: _number(v) for k, v in self.lr_mult.items()},
                "wd_mult": {k: _number(v) for k, v in self.wd_mult.items()},
            },
            allow_nan=False,
        )

    def _check(self) -> None:
        _kvstore._check_optimizer_json(self._json())

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.params.items()))
        if self.lr_scheduler is not None:
            args += f"{', ' if args else ''}lr_scheduler={self.lr_scheduler!r}"
        return f"{type(self).__name__}({args})"


def _number(v: Any) -> Any:
    """`v` for the store's JSON: a non-finite float as the string the store reads (and
    rejects with a message that names it)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def _optimizer(cls_name: str, name: str, doc: str) -> Type[Optimizer]:
    def __init__(self: Optimizer, **kwargs: Any) -> None:
        Optimizer.__init__(self, None, **kwargs)

    __init__.__doc__ = doc
    return type(cls_name, (Optimizer,), {"name": name, "__init__": __init__, "__doc__": doc, "__module__": __name__})


SGD = _optimizer("SGD", "sgd", "Stochastic gradient descent, with ``momentum`` (default 0) and ``lazy_update``.")
NAG = _optimizer("NAG", "nag", "Nesterov accelerated gradient, with ``momentum`` (default 0).")
Adam = _optimizer("Adam", "adam", "Adam: ``beta1`` 0.9, ``beta2`` 0.999, ``epsilon`` 1e-8, ``learning_rate`` 0.001.")
AdaGrad = _optimizer("AdaGrad", "adagrad", "AdaGrad: ``eps`` 1e-7.")
RMSProp = _optimizer(
    "RMSProp", "rmsprop", "RMSProp: ``gamma1`` 0.9, ``gamma2`` 0.9, ``epsilon`` 1e-8, ``centered``, ``clip_weights``."
)
AdaDelta = _optimizer("AdaDelta", "adadelta", "AdaDelta: ``rho`` 0.9, ``epsilon`` 1e-5.")
Ftrl = _optimizer("Ftrl", "ftrl", "FTRL-proximal: ``lamda1`` 0.01, ``beta`` 1, ``learning_rate`` 0.1.")
Signum = _optimizer("Signum", "signum", "Signum: ``momentum`` 0.9, ``wd_lh`` 0.")
SGLD = _optimizer("SGLD", "sgld", "Stochastic gradient Langevin dynamics (``seed`` for its noise).")
DCASGD = _optimizer("DCASGD", "dcasgd", "Delay-compensated asynchronous SGD: ``momentum`` 0, ``lamda`` 0.04.")
Adamax = _optimizer("Adamax", "adamax", "Adamax: ``beta1`` 0.9, ``beta2`` 0.999, ``learning_rate`` 0.002.")
Nadam = _optimizer("Nadam", "nadam", "Nadam: ``beta1`` 0.9, ``beta2`` 0.999, ``epsilon`` 1e-8, ``schedule_decay`` 0.004.")
LAMB = _optimizer(
    "LAMB", "lamb", "LAMB: ``beta1`` 0.9, ``beta2`` 0.999, ``epsilon`` 1e-6, ``lower_bound``, ``upper_bound``, ``bias_correction``."
)
LARS = _optimizer(
    "LARS", "lars", "LARS: ``momentum`` 0, ``eta`` 0.001, ``eps`` 0, ``momentum_correction``, ``lazy_update``."
)
FTML = _optimizer("FTML", "ftml", "FTML, Follow the Moving Leader: ``beta1`` 0.6, ``beta2`` 0.999, ``epsilon`` 1e-8.")
LBSGD = _optimizer(
    "LBSGD",
    "lbsgd",
    "Large-batch SGD: ``momentum`` 0, ``warmup_strategy`` \"linear\" (\"power2\", \"sqrt\", \"lars\"; any "
    "other name scales the rate by 1, as in MXNet), ``warmup_epochs`` 5, ``batch_scale`` 1 (the pushes "
    "whose gradients one update averages), ``updates_per_epoch`` 32, ``begin_epoch`` 0.",
)

_REGISTRY: Dict[str, Type[Optimizer]] = {
    c.name: c for c in (SGD, NAG, Adam, AdaGrad, RMSProp, AdaDelta, Ftrl, Signum, SGLD, DCASGD, Adamax, Nadam, LAMB, LARS, FTML, LBSGD)
}
_REGISTRY["ccsgd"] = SGD


def create(name: str, **kwargs: Any) -> Optimizer:
    """The optimizer registered as `name` (MXNet's names, any case: ``"sgd"``,
    ``"adam"``, ``"ccsgd"``, ...) with the given hyper-parameters."""
    cls = _REGISTRY.get(name.lower())
    if cls is None:
        return Optimizer(name, **kwargs)  # the store names the optimizers it has
    return cls(**kwargs)


def register(klass: type) -> type:
    """MXNet's decorator for new optimizers: the store runs only its own, so this
    raises :class:`kvstore.UnsupportedError` for any other."""
    from .errors import UnsupportedError

    raise UnsupportedError(
        f"optimizer {klass.__name__} cannot be registered: the store runs its own optimizers "
        f"({', '.join(sorted(_REGISTRY))}); use kv.set_updater(fn) for a custom update"
    )
