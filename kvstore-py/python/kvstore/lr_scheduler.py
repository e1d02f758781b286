"""Learning-rate schedules, with MXNet's names and arguments
(``mxnet.lr_scheduler``): pass one to an optimizer as ``lr_scheduler=``::

    from kvstore import optimizer, lr_scheduler
    sched = lr_scheduler.FactorScheduler(step=10, factor=0.5)
    kv.set_optimizer(optimizer.SGD(learning_rate=0.1, lr_scheduler=sched))

The store runs the schedule itself (per update count), exactly as in the Rust, Java
and Clojure bindings.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

__all__ = ["LRScheduler", "FactorScheduler", "MultiFactorScheduler", "PolyScheduler", "CosineScheduler"]


class LRScheduler:
    """The base of the schedules: the warm-up options every schedule has.

    ``base_lr`` is the rate the schedule starts from (the optimizer's
    ``learning_rate`` replaces it, as in MXNet); ``warmup_steps`` updates go from
    ``warmup_begin_lr`` to it, ``warmup_mode`` ``"linear"`` or ``"constant"``.
    """

    _type = ""

    def __init__(
        self,
        base_lr: Optional[float] = None,
        warmup_steps: int = 0,
        warmup_begin_lr: float = 0.0,
        warmup_mode: str = "linear",
    ) -> None:
        self.base_lr = base_lr
        self.warmup_steps = warmup_steps
        self.warmup_begin_lr = warmup_begin_lr
        self.warmup_mode = warmup_mode

    def _fields(self) -> Dict[str, Any]:
        return {}

    def _spec(self) -> Dict[str, Any]:
        """The schedule as the store's JSON description."""
        spec: Dict[str, Any] = {"type": self._type, **self._fields()}
        if self.base_lr is not None:
            spec["base_lr"] = float(self.base_lr)
        if self.warmup_steps:
            spec["warmup_steps"] = int(self.warmup_steps)
            spec["warmup_begin_lr"] = float(self.warmup_begin_lr)
            spec["warmup_mode"] = self.warmup_mode
        return spec

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._spec().items() if k != "type")
        return f"{type(self).__name__}({fields})"


class FactorScheduler(LRScheduler):
    """Multiplies the rate by ``factor`` every ``step`` updates, down to
    ``stop_factor_lr``."""

    _type = "factor"

    def __init__(self, step: int, factor: float = 1.0, stop_factor_lr: float = 1e-8, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step = step
        self.factor = factor
        self.stop_factor_lr = stop_factor_lr

    def _fields(self) -> Dict[str, Any]:
        return {"step": int(self.step), "factor": float(self.factor), "stop_factor_lr": float(self.stop_factor_lr)}


class MultiFactorScheduler(LRScheduler):
    """Multiplies the rate by ``factor`` after each update count in ``step`` (an
    increasing list)."""

    _type = "multifactor"

    def __init__(self, step: Sequence[int], factor: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step = list(step)
        self.factor = factor

    def _fields(self) -> Dict[str, Any]:
        return {"steps": [int(s) for s in self.step], "factor": float(self.factor)}


class PolyScheduler(LRScheduler):
    """Decays the rate polynomially (power ``pwr``) to ``final_lr`` at
    ``max_update``."""

    _type = "poly"

    def __init__(self, max_update: int, pwr: float = 2.0, final_lr: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_update = max_update
        self.pwr = pwr
        self.final_lr = final_lr

    def _fields(self) -> Dict[str, Any]:
        return {"max_update": int(self.max_update), "pwr": float(self.pwr), "final_lr": float(self.final_lr)}


class CosineScheduler(LRScheduler):
    """Decays the rate along a half cosine to ``final_lr`` at ``max_update``."""

    _type = "cosine"

    def __init__(self, max_update: int, final_lr: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_update = max_update
        self.final_lr = final_lr

    def _fields(self) -> Dict[str, Any]:
        return {"max_update": int(self.max_update), "final_lr": float(self.final_lr)}
