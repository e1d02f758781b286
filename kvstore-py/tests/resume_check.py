"""What test_torch_resume.py and test_gluon_resume.py check of a job that commits every
step (its last argument DIE: the step after whose commit its last rank kills itself in
the launcher's first run, -1 for never; it prints `restored STEP EXTRA` when it resumed,
with EXTRA `loader at STEP`): run whole, and run killed then resumed, the two end with
the same bits. On a `local` store, or under `kvstore-run` with `mpirun -np 2`."""

import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

from kvstore import _kvstore

DIE = 2


def local_runs(tmp_path, job, *args, env=None):
    """The job (`python JOB ARGS... DIE`) run whole, then killed and run again (KVSTORE_JOB
    and KVSTORE_COMMIT_DIR set): the outputs of the whole run and the resumed one."""

    def run(name, die):
        full_env = dict(env or os.environ, KVSTORE_JOB=name, KVSTORE_COMMIT_DIR=str(tmp_path))
        cmd = [sys.executable, str(job), *map(str, args), str(die)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=full_env)

    whole = run("whole", -1)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    died = run("died", DIE)
    assert died.returncode == -signal.SIGKILL, died.stdout + died.stderr
    resumed = run("died", -1)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"restored {DIE} loader at {DIE}" in resumed.stdout, resumed.stdout
    return whole.stdout, resumed.stdout


def launcher_runs(tmp_path, name, job, *args, env=None, forward=()):
    """The job run by `kvstore-run ... mpirun -np 2` whole, then with rank 1 killed after
    the commit of step DIE (dist_sync; `forward`: more variables for mpirun to pass on):
    the two runs' outputs. Skipped without MPI (failed under KVSTORE_REQUIRE_MPI=1)."""
    exe = pathlib.Path(sys.executable).parent / "kvstore-run"
    if not _kvstore._has_mpi() or shutil.which("mpirun") is None or not exe.exists():
        if os.environ.get("KVSTORE_REQUIRE_MPI") == "1":
            raise RuntimeError("KVSTORE_REQUIRE_MPI=1, but this build has no MPI, mpirun or kvstore-run")
        pytest.skip("this kvstore build has no MPI (see scripts/test-python-mpi.sh)")
    full_env = dict(
        env or os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", KVSTORE_COMMIT_DIR=str(tmp_path)
    )
    mpirun = [a for v in ("KVSTORE_COMMIT_DIR", *forward) for a in ("-x", v)]
    mpirun += ["--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable, str(job), *map(str, args)]
    runs = {}
    for run, die in [("whole", -1), ("kill", DIE)]:
        cmd = [str(exe), "--job", f"{name}-{run}", *mpirun, str(die)]
        runs[run] = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full_env)
        assert runs[run].returncode == 0, runs[run].stdout + runs[run].stderr
    killed = runs["kill"].stdout + runs["kill"].stderr
    assert "kvstore-run: rank 1 died (signal 9)" in killed, killed
    assert killed.count(f"restored {DIE} loader at {DIE}") == 2, killed
    assert not list(tmp_path.glob("kvstore-*")), "the commits of a job that ended well are removed"
    return runs["whole"].stdout, runs["kill"].stdout
