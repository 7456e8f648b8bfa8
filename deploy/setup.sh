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
