#!/usr/bin/env bash
# deploy/bench/flamegraph.sh — a py-spy flame graph of the default worker on the batched case: the same
# simulated 8 x 8 cluster as `throughput.py --case batched` (100 samples a message) published as a backlog,
# then `flopwatch worker` (ingest with derive, spikes and frames on Kafka) read it all under py-spy.
#
#   deploy/bench/flamegraph.sh [SECONDS_OF_EVENT_TIME, default 600] [OUT.svg, default
#                               build/flamegraphs/worker-batched.svg]
#
# Beside the SVG, OUT.txt: the collapsed stacks (py-spy's raw format) of a second run, and the 25
# functions with the most samples of their own, which docs/performance.md quotes.
#
# Needs a Kafka broker (FLOPWATCH_KAFKA_BOOTSTRAP, default 127.0.0.1:9092; deploy/kafka.sh start) and py-spy
# (pip install py-spy; the `bench` extra). Topics, group and chDB directory are fresh and removed after.
# py-spy reads the worker's memory: run as root or with ptrace allowed (kernel.yama.ptrace_scope=0).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
seconds="${1:-600}"
out="${2:-build/flamegraphs/worker-batched.svg}"
py=.venv/bin/python
spy="$(command -v py-spy || echo .venv/bin/py-spy)"
[[ -x "$spy" ]] || { echo "flamegraph: py-spy not found (pip install py-spy)" >&2; exit 1; }
tag="flame$(date +%s)"
work="$(mktemp -d)"
export FLOPWATCH_KAFKA_BOOTSTRAP="${FLOPWATCH_KAFKA_BOOTSTRAP:-127.0.0.1:9092}" FLOPWATCH_TOPIC_PREFIX="$tag." \
  FLOPWATCH_GROUP_ID="$tag" FLOPWATCH_CHDB_PATH="$work/chdb" FLOPWATCH_CLICKHOUSE_BACKEND=chdb \
  FLOPWATCH_WEB_ENABLED=false
cleanup() {
  "$py" - <<'PY' || true
from agents.kafka.admin import delete_topics
from agents.settings import load_settings
delete_topics(load_settings())
PY
  rm -rf "$work"
}
trap cleanup EXIT
"$py" -m agents.cli.main simulate --nodes 8 --gpus 8 --batch-size 100 --mode backlog --duration "$seconds" --seed 1 >&2
mkdir -p "$(dirname "$out")"
# Active samples only (no --idle): where the CPU goes, not where threads wait. --nonblocking: py-spy reads the
# worker's memory without stopping it; stopped 250 times a second, the worker fell seconds behind, its loop missed
# the group's heartbeats and the group dropped it, so the profile showed the replays of a rebalance storm.
"$spy" record --nonblocking --rate 250 --format flamegraph --output "$out" -- \
  "$py" -m agents.cli.main worker --runtime plain --exit-when-idle 3 --progress json 2>"$work/worker.log" >&2 \
  || { tail -20 "$work/worker.log" >&2; exit 1; }
# The same again in the collapsed-stack format, for a table of where the time goes.
"$py" -c 'from agents.kafka.admin import delete_topics; from agents.settings import load_settings; delete_topics(load_settings())'
"$py" -m agents.cli.main simulate --nodes 8 --gpus 8 --batch-size 100 --mode backlog --duration "$seconds" --seed 1 >&2
rm -rf "$work/chdb"
"$spy" record --nonblocking --rate 250 --format raw --output "$work/stacks.txt" -- \
  "$py" -m agents.cli.main worker --runtime plain --exit-when-idle 3 --progress json 2>"$work/worker.log" >&2 \
  || { tail -20 "$work/worker.log" >&2; exit 1; }
"$py" deploy/bench/stacks.py "$work/stacks.txt" "${out%.svg}.txt" --rate 250 >/dev/null
cat "${out%.svg}.txt" >&2
echo "$out"
