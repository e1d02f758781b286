"""The type stubs match the native module, and the package type-checks (mypy)."""

import subprocess
import sys

import pytest

mypy = pytest.importorskip("mypy", reason="mypy is not installed (scripts/test-python.sh installs it)")


def run_mypy(*args):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=600)


def test_the_stubs_match_the_native_module():
    done = run_mypy("mypy.stubtest", "kvstore._kvstore")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_package_and_a_users_program_type_check(tmp_path):
    program = tmp_path / "user.py"
    program.write_text(
        "import numpy as np\n"
        "import kvstore as kv\n"
        "from kvstore import lr_scheduler, optimizer\n"
        "s = kv.create('local')\n"
        "s.init(3, np.ones(3))\n"
        "s.push([3], [np.ones(3)])\n"
        "f: kv.Future = s.push_async(3, np.ones(3))\n"
        "f.result(1.0)\n"
        "s.set_optimizer(optimizer.SGD(learning_rate=0.1, lr_scheduler=lr_scheduler.FactorScheduler(step=2)))\n"
        "n: int = s.num_workers + s.rank\n"
        "t: str = s.type\n"
    )
    done = run_mypy("mypy", "--no-incremental", "-p", "kvstore")
    assert done.returncode == 0, done.stdout + done.stderr
    done = run_mypy("mypy", "--no-incremental", "--strict", str(program))
    assert done.returncode == 0, done.stdout + done.stderr
    # A wrong use is caught.
    program.write_text("import kvstore as kv\nn: str = kv.create('local').num_workers\n")
    done = run_mypy("mypy", "--no-incremental", str(program))
    assert done.returncode != 0 and "user.py:2: error: Incompatible types" in done.stdout, done.stdout
