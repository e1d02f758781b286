"""The two wheels, ``kvstore`` and ``kvstore-mpi``, are one package: an environment
that has both is refused at import, with the fix (docs/python.md)."""

import os
import pathlib
import subprocess
import sys

import kvstore

PACKAGE = pathlib.Path(kvstore.__file__).resolve().parent


def import_from(site, tmp_path):
    """`import kvstore` in a fresh interpreter whose first path entry is `site`."""
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run(
        [sys.executable, "-c", "import kvstore; print(kvstore.__version__)"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )


def fake_site(tmp_path, distributions):
    """A site-packages folder with the installed package and the given wheels' records."""
    site = tmp_path / "site-packages"
    site.mkdir(parents=True)
    (site / "kvstore").symlink_to(PACKAGE, target_is_directory=True)
    for name in distributions:
        record = site / f"{name}-{kvstore.__version__}.dist-info"
        record.mkdir()
        (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\n")
    return site


def test_one_wheel_imports(tmp_path):
    for name in ("kvstore", "kvstore_mpi"):
        result = import_from(fake_site(tmp_path / name, [name]), tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == kvstore.__version__


def test_both_wheels_in_one_environment_are_refused_with_the_fix(tmp_path):
    result = import_from(fake_site(tmp_path, ["kvstore", "kvstore_mpi"]), tmp_path)
    assert result.returncode != 0
    assert "ImportError: both the kvstore and the kvstore-mpi wheels are installed" in result.stderr, result.stderr
    assert "pip uninstall -y kvstore kvstore-mpi" in result.stderr, result.stderr
