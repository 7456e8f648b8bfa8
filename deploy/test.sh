#!/usr/bin/env bash
# deploy/test.sh — the test command: installs what is missing, starts Kafka (KRaft) and
# clickhouse-server, runs every test against them, and stops them again.
#
# Extra arguments go to pytest (e.g. deploy/test.sh tests/unit -x).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
deploy/setup.sh
# Started here rather than by the test session so a broken install fails before any test.
env_file="$(mktemp)"
# services.sh leaves a broker alone when FLOPWATCH_KAFKA_BOOTSTRAP names it: stop with the
# caller's value, not the one sourced below, so the broker started here is stopped too.
caller_bootstrap="${FLOPWATCH_KAFKA_BOOTSTRAP-}"
stop_services() {
  if [ -n "$caller_bootstrap" ]; then
    FLOPWATCH_KAFKA_BOOTSTRAP="$caller_bootstrap" deploy/services.sh stop >&2 || true
  else
    env -u FLOPWATCH_KAFKA_BOOTSTRAP deploy/services.sh stop >&2 || true
  fi
  rm -f "$env_file"
}
trap stop_services EXIT
deploy/services.sh start > "$env_file"
# shellcheck disable=SC1090
source "$env_file"
# The whole suite runs on pytest-xdist workers: the integration tests, which mostly wait on the wall clock, in two
# queues side by side (those with services of their own, and those on the session's; tests/conftest.py), the unit
# tests and doctests wherever a worker is free. FLOPWATCH_TEST_WORKERS=0 runs everything in this process.
# Arguments given, pytest gets only those.
args=("$@")
if [ $# -eq 0 ]; then
  args=(-n "${FLOPWATCH_TEST_WORKERS:-2}" --dist loadgroup)
fi
# The slowest tests printed every run: CI time is a budget.
.venv/bin/python -m pytest --durations=20 "${args[@]}"
