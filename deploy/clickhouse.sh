#!/usr/bin/env bash
# deploy/clickhouse.sh — a local clickhouse-server for the native-protocol sink
# tests, run as a plain background process (no systemd) with all state under
# ${FLOPWATCH_STATE_DIR:-<repo>/.flopwatch}/clickhouse.
#
#   deploy/clickhouse.sh install   apt-get install Debian's clickhouse-server/-client
#   deploy/clickhouse.sh start     start (idempotent), wait for `SELECT 1`
#   deploy/clickhouse.sh stop      SIGTERM, up to 30 s, then SIGKILL
#   deploy/clickhouse.sh status    exit 0 if running
#   deploy/clickhouse.sh client …  clickhouse-client against this server
#
# Environment (all optional):
#   FLOPWATCH_STATE_DIR                  default <repo>/.flopwatch
#   FLOPWATCH_CLICKHOUSE_PORT            native TCP port, default 9000
#   FLOPWATCH_CLICKHOUSE_HTTP_PORT       HTTP port, default 8123
#   FLOPWATCH_CLICKHOUSE_SECURE_PORT     native protocol over TLS, default port + 440
#                                        (9440), certificate of a throw-away CA in
#                                        <state>/tls/ca.pem (deploy/tls.sh)
#   FLOPWATCH_CLICKHOUSE_TEST_PASSWORD   password of user `flopwatch`,
#                                        default "flopwatch-test"
#   FLOPWATCH_CLICKHOUSE_START_TIMEOUT   default 60 (s)
#   FLOPWATCH_CLICKHOUSE_INSTANCE        state directory's name under the state dir, default
#                                        "clickhouse"; deploy/clickhouse-cluster.sh runs one per
#                                        node, with its cluster settings in <state>/config.d/
#
# Users: `default` (no password, 127.0.0.1/::1 only) and `flopwatch` (password
# above, stored as SHA-256) so that the sink's password authentication is
# exercised by the tests too.
#
# ---------------------------------------------------------------------------
# What Debian's 18.16 (package 18.16.1+ds-7.3+b2, bookworm) accepts, measured
# 2026-12-02 against a server started by this script. Tests that run on this
# server must stay inside it; the production schema (DESIGN "Storage") does not.
#
#   version()            18.16.1
#   native protocol      server Hello: revision 54412, version patch 1, sends
#                        its timezone and display name (clickhouse-driver OK);
#                        answers 54412 whatever revision the client offers.
#   auth                 users.xml password_sha256_hex works for native and HTTP
#                        (?user=&password=); a wrong password is Code 193.
# Types
#   DateTime64(3)        NO  "Unknown data type family: DateTime64" (toDateTime64
#                        also unknown). Store ts_ns UInt64 (+ DateTime for
#                        partitioning: toDateTime(intDiv(ts_ns, 1000000000))).
#   DateTime('UTC'), Date, (U)Int*, Float32/64, String, UUID, Enum8,
#   Array(T), Decimal(18,6), AggregateFunction(avg, Float64)   yes
#   Nullable(T)          yes
#   LowCardinality(T)    only with the setting allow_experimental_low_cardinality_type=1
#                        (client/session/query setting; else Code 44). Use String.
# Tables
#   ENGINE = MergeTree PARTITION BY … PRIMARY KEY … ORDER BY … SETTINGS …   yes
#   old MergeTree(date, (key), 8192)                                       yes
#   ReplacingMergeTree(ver) PARTITION BY … ORDER BY …                      yes
#   SummingMergeTree, AggregatingMergeTree, column DEFAULT/MATERIALIZED/COMMENT yes
#   CREATE MATERIALIZED VIEW … ENGINE = … AS SELECT                        yes
#   TTL (table or column)  NO (syntax error)      column CODEC(...)  NO (syntax error)
# Dedup / idempotency
#   insert_deduplicate   exists (default 1) but acts on Replicated* tables only:
#                        the same INSERT block twice into a (Replacing)MergeTree
#                        stores 2 rows. insert_deduplication_token: unknown
#                        setting (Code 115); MergeTree setting
#                        non_replicated_deduplication_window: unknown (Code 36);
#                        INSERT … SETTINGS … VALUES: syntax error (pass settings
#                        per query/connection instead).
#                        => on 18.16, idempotent writes = deterministic row id in
#                        a ReplacingMergeTree ORDER BY key, read with FINAL
#                        (tested: 2 rows, FINAL -> 1, OPTIMIZE … FINAL -> 1) or
#                        argMax.
# Queries / functions
#   FINAL, argMax, quantileTDigest, LIMIT n BY, ALTER TABLE … DELETE (mutation),
#   numbers(), INSERT … FORMAT JSONEachRow, toStartOfMinute/FiveMinute/Hour/Day yes
#   toStartOfInterval, toStartOfTenMinutes, toStartOfFifteenMinute, currentUser()
#                        NO (unknown function): grid with intDiv(ts, step) * step.
#
# The DDL the self-test used (accepted, insert + select + FINAL worked):
#   CREATE TABLE t (ts DateTime('UTC'), ts_ns UInt64, node String, gpu String,
#     value Float64, note Nullable(String), row_id UInt64)
#   ENGINE = ReplacingMergeTree(ts_ns) PARTITION BY toYYYYMMDD(ts)
#   ORDER BY (node, gpu, ts_ns, row_id)
# ---------------------------------------------------------------------------
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state_root="${FLOPWATCH_STATE_DIR:-$repo_root/.flopwatch}"
instance="${FLOPWATCH_CLICKHOUSE_INSTANCE:-clickhouse}"
[[ "$instance" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "clickhouse: FLOPWATCH_CLICKHOUSE_INSTANCE=$instance: letters, digits, - and _ only" >&2; exit 2; }
state="$state_root/$instance"
port="${FLOPWATCH_CLICKHOUSE_PORT:-9000}"
http_port="${FLOPWATCH_CLICKHOUSE_HTTP_PORT:-8123}"
secure_port="${FLOPWATCH_CLICKHOUSE_SECURE_PORT:-$((port + 440))}"  # native protocol over TLS
password="${FLOPWATCH_CLICKHOUSE_TEST_PASSWORD:-flopwatch-test}"
timeout_s="${FLOPWATCH_CLICKHOUSE_START_TIMEOUT:-60}"
pidfile="$state/clickhouse.pid"
config="$state/config.xml"
logs="$state/logs"

say() { echo "clickhouse: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=deploy/proc.sh
source "$(dirname "${BASH_SOURCE[0]}")/proc.sh"
# shellcheck source=deploy/tls.sh
source "$(dirname "${BASH_SOURCE[0]}")/tls.sh"

# Debian 18.16 ships a small /usr/sbin/clickhouse-server linked to
# libclickhouse.so; upstream packages ship one /usr/bin/clickhouse binary with
# `server` / `client` subcommands. Accept either.
server_cmd() {
  if [[ -x /usr/sbin/clickhouse-server ]]; then echo /usr/sbin/clickhouse-server
  elif command -v clickhouse-server >/dev/null; then command -v clickhouse-server
  elif command -v clickhouse >/dev/null; then echo "$(command -v clickhouse) server"
  else return 1
  fi
}
client_cmd() {
  if command -v clickhouse-client >/dev/null; then command -v clickhouse-client
  elif command -v clickhouse >/dev/null; then echo "$(command -v clickhouse) client"
  else return 1
  fi
}

client() {
  local c
  c="$(client_cmd)" || die "clickhouse-client not installed (run: $0 install)"
  # shellcheck disable=SC2086  # "clickhouse client" is two words on purpose
  $c --host 127.0.0.1 --port "$port" "$@"
}

do_install() {
  if server_cmd >/dev/null && client_cmd >/dev/null; then
    say "already installed: $(server_cmd)"
    return 0
  fi
  apt_install --with-recommends clickhouse-server clickhouse-client
  server_cmd >/dev/null || die "installed, but no clickhouse server binary found"
}

write_config() {
  mkdir -p "$state/data" "$state/tmp" "$state/user_files" "$state/format_schemas" "$logs"
  [[ -f "$state_root/.gitignore" ]] || printf '*\n' >"$state_root/.gitignore"
  local sha
  sha="$(printf '%s' "$password" | sha256sum | cut -d' ' -f1)"
  make_test_tls "$state/tls"

  # Small caches and connection limits for a laptop/CI box; everything
  # (data, tmp, logs, user_files) under the state dir so nothing needs root
  # and several checkouts can run side by side on different ports.
  cat >"$config" <<EOF
<?xml version="1.0"?>
<!-- Generated by deploy/clickhouse.sh on every start; edit the script. -->
<yandex>
    <logger>
        <level>information</level>
        <log>$logs/clickhouse-server.log</log>
        <errorlog>$logs/clickhouse-server.err.log</errorlog>
        <size>100M</size>
        <count>3</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>$port</tcp_port>
    <tcp_port_secure>$secure_port</tcp_port_secure>
    <http_port>$http_port</http_port>
    <!-- TLS for the native protocol, with a throw-away CA ($state/tls/ca.pem: what clients trust). -->
    <openSSL>
        <server>
            <certificateFile>$state/tls/server.crt</certificateFile>
            <privateKeyFile>$state/tls/server.key</privateKeyFile>
            <verificationMode>none</verificationMode>
            <loadDefaultCAFile>false</loadDefaultCAFile>
            <cacheSessions>true</cacheSessions>
            <disableProtocols>sslv2,sslv3</disableProtocols>
            <preferServerCiphers>true</preferServerCiphers>
        </server>
    </openSSL>
    <max_connections>256</max_connections>
    <keep_alive_timeout>3</keep_alive_timeout>
    <max_concurrent_queries>50</max_concurrent_queries>
    <uncompressed_cache_size>268435456</uncompressed_cache_size>
    <mark_cache_size>268435456</mark_cache_size>
    <path>$state/data/</path>
    <tmp_path>$state/tmp/</tmp_path>
    <user_files_path>$state/user_files/</user_files_path>
    <format_schema_path>$state/format_schemas/</format_schema_path>
    <users_config>$state/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <!-- Deterministic DateTime rendering in tests, whatever the host's TZ. -->
    <timezone>UTC</timezone>
    <mlock_executable>false</mlock_executable>
    <!-- ZooKeeper, macros and remote_servers of a cluster node come from config.d/ (clickhouse-cluster.sh). -->
</yandex>
EOF

  cat >"$state/users.xml" <<EOF
<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>2000000000</max_memory_usage>
            <load_balancing>random</load_balancing>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
        <flopwatch>
            <password_sha256_hex>$sha</password_sha256_hex>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </flopwatch>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries><errors>0</errors><result_rows>0</result_rows>
                <read_rows>0</read_rows><execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
EOF
}



ready() { client -q 'SELECT 1' >/dev/null 2>&1; }

wait_ready() {  # [pid]
  local deadline=$((SECONDS + timeout_s))
  while ((SECONDS < deadline)); do
    if [[ -n "${1:-}" ]] && ! kill -0 "$1" 2>/dev/null; then
      tail -n 30 "$logs/clickhouse-server.err.log" "$logs/stdout.log" 2>/dev/null >&2 || true
      rm -f "$pidfile"
      die "server exited during startup (logs: $logs)"
    fi
    if ready; then
      echo "127.0.0.1:$port"
      return 0
    fi
    sleep 0.5
  done
  tail -n 30 "$logs/clickhouse-server.err.log" 2>/dev/null >&2 || true
  die "not ready after ${timeout_s}s on 127.0.0.1:$port"
}

do_start() {
  already_running && return
  local srv
  srv="$(server_cmd)" || die "clickhouse-server not installed (run: $0 install)"
  ports_free "FLOPWATCH_CLICKHOUSE_PORT / FLOPWATCH_CLICKHOUSE_HTTP_PORT" "$port" "$http_port"
  write_config
  # The server raises its open-files limit itself and only warns when it
  # cannot; raising the soft limit here avoids "too many open files" under
  # parallel inserts on boxes with a 1024 default.
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  # In $state: the server resolves some relative paths against its working dir.
  # shellcheck disable=SC2086  # "clickhouse server" is two words on purpose
  launch "$logs/stdout.log" $srv --config-file="$config"
}

address="127.0.0.1:$port"
case "${1:-}" in
  client) shift; client "$@" ;;
  *) service_main "|client [clickhouse-client args]" -- "$@" ;;
esac
