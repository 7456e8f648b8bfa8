#!/usr/bin/env bash
# deploy/services.sh — start/stop the local Kafka, ClickHouse, Alertmanager and Prometheus together.
#
#   eval "$(deploy/services.sh start)"   # start them all, export their settings
#   deploy/services.sh stop              # stop them all
#   deploy/services.sh status            # exit 0 if all run
#
# `start` prints only `export …` lines on stdout (progress goes to stderr), so
# that its output can be eval'ed by a shell or a test harness. The variables
# are the ones agents/ settings read (FLOPWATCH_ALERTMANAGER_URL: the one
# `flopwatch alerts forward` reads), and for the tests FLOPWATCH_PROMETHEUS_URL and
# FLOPWATCH_PROMETHEUS_TARGETS (the file_sd file a test writes its /metrics endpoint
# into). The same environment as kafka.sh, clickhouse.sh, alertmanager.sh and
# prometheus.sh applies (ports, state dir,
# FLOPWATCH_KAFKA_BOOTSTRAP for an existing broker,
# FLOPWATCH_CLICKHOUSE_TEST_PASSWORD).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

case "${1:-}" in
  start)
    bootstrap="$("$here/kafka.sh" start)"
    "$here/clickhouse.sh" install >&2
    "$here/clickhouse.sh" start >/dev/null
    "$here/alertmanager.sh" install >&2
    alertmanager_url="$("$here/alertmanager.sh" start)"
    "$here/prometheus.sh" install >&2
    "$here/chromium.sh" install >&2  # a browser, not a service: nothing to start or stop
    "$here/zookeeper.sh" install >&2  # for the two-node cluster test, which starts and stops it itself
    prometheus_url="$("$here/prometheus.sh" start)"
    prometheus_targets="$("$here/prometheus.sh" targets)"
    # printf %q: values survive eval even with spaces or quotes in them.
    printf 'export FLOPWATCH_KAFKA_BOOTSTRAP=%q\n' "$bootstrap"
    printf 'export FLOPWATCH_CLICKHOUSE_BACKEND=native\n'
    printf 'export FLOPWATCH_CLICKHOUSE_HOST=127.0.0.1\n'
    printf 'export FLOPWATCH_CLICKHOUSE_PORT=%q\n' "${FLOPWATCH_CLICKHOUSE_PORT:-9000}"
    printf 'export FLOPWATCH_CLICKHOUSE_USER=flopwatch\n'
    printf 'export FLOPWATCH_CLICKHOUSE_PASSWORD=%q\n' "${FLOPWATCH_CLICKHOUSE_TEST_PASSWORD:-flopwatch-test}"
    printf 'export FLOPWATCH_ALERTMANAGER_URL=%q\n' "$alertmanager_url"
    printf 'export FLOPWATCH_PROMETHEUS_URL=%q\n' "$prometheus_url"
    printf 'export FLOPWATCH_PROMETHEUS_TARGETS=%q\n' "$prometheus_targets"
    ;;
  stop)
    # Stop each even if another fails to stop cleanly.
    rc=0
    "$here/kafka.sh" stop || rc=$?
    "$here/clickhouse.sh" stop || rc=$?
    "$here/alertmanager.sh" stop || rc=$?
    "$here/prometheus.sh" stop || rc=$?
    exit "$rc"
    ;;
  status)
    rc=0
    "$here/kafka.sh" status || rc=1
    "$here/clickhouse.sh" status || rc=1
    "$here/alertmanager.sh" status || rc=1
    "$here/prometheus.sh" status || rc=1
    exit "$rc"
    ;;
  *)
    echo "usage: $0 {start|stop|status}" >&2
    exit 2
    ;;
esac
