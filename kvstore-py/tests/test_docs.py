"""Every public name of the package has a docstring, and help() on the calls explains
their forms."""

import inspect

import pytest

import kvstore as kv
from kvstore import errors, lr_scheduler, optimizer


def public_names():
    for module in (kv, optimizer, lr_scheduler, errors):
        for name in getattr(module, "__all__", []):
            if name.startswith("__"):
                continue
            obj = getattr(module, name)
            yield f"{module.__name__}.{name}", obj
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not (callable(member) or isinstance(member, property)):
                        continue
                    yield f"{module.__name__}.{name}.{attr}", member
    # The native store's calls, which the package's KVStore inherits.
    for attr in dir(kv.KVStore):
        if not attr.startswith("_"):
            yield f"kvstore.KVStore.{attr}", getattr(kv.KVStore, attr)


@pytest.mark.parametrize("name,obj", list(public_names()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_public_name_has_a_docstring(name, obj):
    doc = inspect.getdoc(obj)
    assert doc and len(doc.strip()) >= 10, f"{name} has no docstring"


def test_the_optimizer_and_schedule_lists_are_complete():
    assert len([n for n in optimizer.__all__ if n not in ("Optimizer", "create", "register")]) == 16
    assert {"FactorScheduler", "MultiFactorScheduler", "PolyScheduler", "CosineScheduler"} <= set(lr_scheduler.__all__)
