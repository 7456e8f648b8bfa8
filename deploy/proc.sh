# deploy/proc.sh — process handling shared by the service scripts (sourced, not run).
#
# The caller sets: pidfile (where the pid lives), config (a path that appears in our
# process's command line, so a reused pid or a system-wide server is never taken for
# ours) and defines say() and die(); the HTTP helpers also use url, repo_root and timeout_s.

pid_alive() {
  [[ -f "$pidfile" ]] || return 1
  local pid
  pid="$(cat "$pidfile" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$config"
}

# SIGTERM, up to 30 s for a clean shutdown, then SIGKILL.
do_stop() {
  if ! pid_alive; then
    rm -f "$pidfile"
    say "not running"
    return 0
  fi
  local pid i
  pid="$(cat "$pidfile")"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 60; i++)); do  # 60 x 0.5 s = 30 s
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "still running after 30 s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  rm -f "$pidfile"
  say "stopped"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ready: 0 once "$url/-/ready" answers 200 (Prometheus and Alertmanager: configuration loaded, API up).
ready() {
  local py="$repo_root/.venv/bin/python"
  [[ -x "$py" ]] || py=python3
  "$py" - "$url/-/ready" <<'EOF' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
    sys.exit(0 if r.status == 200 else 1)
EOF
}

# wait_ready_log LOG [pid]: print $url once ready within $timeout_s; fail with the log's tail if the
# process (pid) exits first or the time runs out.
wait_ready_log() {
  local log="$1" pid="${2:-}" deadline=$((SECONDS + timeout_s))
  while ((SECONDS < deadline)); do
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$log" >&2 2>/dev/null || true
      rm -f "$pidfile"
      die "exited during startup (log: $log)"
    fi
    if ready; then
      echo "$url"
      return 0
    fi
    sleep 0.3
  done
  tail -n 30 "$log" >&2 2>/dev/null || true
  die "not ready after ${timeout_s}s at $url"
}
