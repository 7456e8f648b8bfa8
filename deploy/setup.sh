#!/usr/bin/env bash
# deploy/setup.sh — create .venv and install flopwatch with its dev tools (idempotent, pip-cached).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
# Reinstall only when pyproject.toml changed since the last install.
stamp=.venv/.flopwatch-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip >&2
  .venv/bin/python -m pip install --quiet -e '.[dev]' >&2
  touch "$stamp"
fi
# The native poll decoder (native/: Rust, built by maturin into the venv), rebuilt when its sources change. It is not
# a dependency in pyproject.toml: pip would look for it on the package index, where the name is not ours.
nstamp=.venv/.flopwatch-native-installed
if [ ! -f "$nstamp" ] || [ -n "$(find native -type f -newer "$nstamp" -not -path 'native/target/*' | head -1)" ]; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"  # rustup's place, often not on PATH
  command -v cargo >/dev/null || { echo "setup: building native/ needs Rust's cargo (https://rustup.rs)" >&2; exit 1; }
  .venv/bin/python -m pip install --quiet ./native >&2
  touch "$nstamp"
fi
