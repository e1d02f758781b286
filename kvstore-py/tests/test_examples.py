"""The examples print what the documents they reproduce show."""

import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def test_the_mxnet_tutorial_prints_what_it_shows():
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "tutorial.py")], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out == (EXAMPLES / "tutorial.expected").read_text()
    # The values the tutorial shows, in its order.
    assert [line for line in out.splitlines() if line.startswith("update")] == [
        "update on key: 3",
        "update on key: 5",
        "update on key: 7",
        "update on key: 9",
    ] * 1 + ["update on key: 5", "update on key: 7", "update on key: 9"]
