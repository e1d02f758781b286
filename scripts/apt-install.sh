#!/usr/bin/env bash
# Installs the given Debian packages that are not installed yet, with apt-get (through
# sudo when not root), retrying while another apt holds the lock. Quiet when all are
# there; exits non-zero, naming them, when they cannot be installed.
# Usage: apt-install.sh PACKAGE...
set -uo pipefail
missing=()
for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null; then
    echo "apt-install.sh: no apt-get here: install ${missing[*]} by hand" >&2
    exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "installing ${missing[*]}"
for attempt in 1 2 3 4 5 6; do
    if $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null; then
        exit 0
    fi
    echo "apt-get failed (attempt $attempt), retrying in 10 s"
    sleep 10
done
echo "apt-install.sh: could not install ${missing[*]}" >&2
exit 1
