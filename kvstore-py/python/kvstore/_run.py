"""The console script ``kvstore-run`` of the kvstore-mpi distribution: runs the
launcher shipped in the package (``kvstore/bin/kvstore-run``), which restarts an MPI job
whose rank died from its last commit (docs/recovery.md)."""

import os
import sys


def main() -> None:
    """Replaces this process with the launcher, its arguments passed on."""
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "kvstore-run")
    if not os.access(exe, os.X_OK):
        raise SystemExit("kvstore-run: this kvstore was built without MPI (pip install kvstore-mpi has the launcher)")
    os.execv(exe, [exe, *sys.argv[1:]])
