#!/usr/bin/env bash
# `make demo`'s Python part: installs the wheel `make python` built into a virtualenv
# (target/py-demo, kept between runs; the wheel is reinstalled each time) and runs
# MXNet's KVStore tutorial in Python, kvstore-py/examples/tutorial.py.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(bash scripts/version.sh)
wheel=$(ls target/wheels/kvstore-"$version"-*.whl | head -n 1)
venv=target/py-demo
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
fi
"$venv/bin/pip" install --quiet --force-reinstall "$wheel"
"$venv/bin/python" kvstore-py/examples/tutorial.py
