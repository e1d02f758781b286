"""The MXNet examples print what the documents they reproduce show, through this store
(``import kvstore.mxnet``), and exactly what the same code prints on MXNet's own store
(the example run without its ``import kvstore.mxnet`` line).

MXNet is not in the main test venv: scripts/test-python.sh runs this file in
target/py-mxnet-venv with KVSTORE_REQUIRE_MXNET=1, where a failed import fails.
"""

import os
import pathlib
import subprocess
import sys

import pytest

try:
    import mxnet  # noqa: F401
except ImportError:
    if os.environ.get("KVSTORE_REQUIRE_MXNET") == "1":
        raise
    pytest.skip(
        "mxnet is not installed here: scripts/test-python.sh runs these tests in target/py-mxnet-venv",
        allow_module_level=True,
    )

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
IMPORT = "import kvstore.mxnet"

# Runs an example and checks, in the same process, that its `kv` is this store.
DRIVER = (
    "import runpy, sys\n"
    "g = runpy.run_path(sys.argv[1], run_name='__main__')\n"
    "import kvstore.mxnet\n"
    "assert isinstance(g['kv'], kvstore.mxnet.KVStore), type(g['kv'])\n"
)


def run(args, **kwargs):
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, **kwargs)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("name", ["mxnet_tutorial", "d2l_kvstore"])
def test_the_example_prints_what_the_document_shows_and_what_mxnet_prints(name, tmp_path):
    source = EXAMPLES / f"{name}.py"
    expected = (EXAMPLES / f"{name}.expected").read_text()
    out = run(["-c", DRIVER, str(source)])
    assert out == expected
    # The same code on MXNet's own store (the import line removed) prints the same.
    lines = source.read_text().splitlines(keepends=True)
    assert sum(line.startswith(IMPORT) for line in lines) == 1
    native = tmp_path / f"{name}_native.py"
    native.write_text("".join(line for line in lines if not line.startswith(IMPORT)))
    assert run([str(native)]) == expected
    # The values the documents show, in their order.
    assert [line for line in out.splitlines() if line.startswith("update")] == [
        "update on key: 3",
        "update on key: 5",
        "update on key: 7",
        "update on key: 9",
        "update on key: 5",
        "update on key: 7",
        "update on key: 9",
    ]
    assert out.rstrip().endswith("[[11. 11. 11.]\n [11. 11. 11.]]")
