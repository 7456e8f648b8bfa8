#!/usr/bin/env bash
# deploy/demo.sh — the demo on a fresh machine: installs flopwatch into .venv, then runs
# `flopwatch demo` (local Kafka in KRaft mode, embedded ClickHouse, a simulated cluster).
# Arguments go to `flopwatch demo`, e.g. deploy/demo.sh --duration 60 --nodes 4 --gpus 8
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/deploy/setup.sh"
exec "$root/.venv/bin/flopwatch" demo "$@"
