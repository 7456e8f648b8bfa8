# deploy/proc.sh — process handling shared by the service scripts (sourced, not run).
#
# The caller sets: pidfile (where the pid lives), config (a path that appears in our
# process's command line, so a reused pid or a system-wide server is never taken for
# ours) and defines say() and die(); the HTTP helpers also use url, repo_root and timeout_s;
# launch and service_main use state, address and the caller's do_install, do_start, wait_ready.

# apt_install [--with-recommends] PACKAGE...: Debian's packages, without their recommendations unless
# asked; the package lists are refreshed only when apt does not know one of them yet (an update is slow).
apt_install() {
  local extra=(--no-install-recommends) sudo=() p
  if [[ "${1:-}" == --with-recommends ]]; then extra=(); shift; fi
  [[ $EUID -eq 0 ]] || sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  for p in "$@"; do
    if ! apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
      "${sudo[@]}" apt-get update -q
      break
    fi
  done
  # A package's postinst may try to start its service (invoke-rc.d): refused without an init system, harmless.
  "${sudo[@]}" apt-get install -y -q "${extra[@]}" "$@"
}

# pid_alive [PIDFILE MARK]: 0 when the pid in PIDFILE ($pidfile) runs and MARK ($config) is in its command line.
pid_alive() {
  local file="${1:-$pidfile}" mark="${2:-$config}" pid
  [[ -f "$file" ]] || return 1
  pid="$(cat "$file" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$mark"
}

# do_stop [PIDFILE MARK]: SIGTERM, up to 30 s for a clean shutdown, then SIGKILL.
do_stop() {
  local file="${1:-$pidfile}" mark="${2:-$config}" pid i
  if ! pid_alive "$file" "$mark"; then
    rm -f "$file"
    say "not running"
    return 0
  fi
  pid="$(cat "$file")"
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
  rm -f "$file"
  say "stopped"
}

# port_open PORT [HOST]: 0 when something accepts connections there (HOST: 127.0.0.1).
port_open() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }

# already_running: 0 when ours runs (then it waits until ready, which prints the address), else 1 and
# a stale pid file is gone.
already_running() {
  if pid_alive; then
    say "already running (pid $(cat "$pidfile"))"
    wait_ready
    return 0
  fi
  rm -f "$pidfile"
  return 1
}

# ports_free HINT PORT...: die when another process holds one of the ports; HINT names what to set.
ports_free() {
  local hint="$1" p
  shift
  for p in "$@"; do
    if port_open "$p"; then die "port $p on 127.0.0.1 is taken by another process; set $hint"; fi
  done
}

# launch LOG COMMAND...: COMMAND in $state, in its own session (setsid: it outlives the shell that
# started it; `stop` ends it), its output appended to LOG; records its pid and waits until ready.
launch() {
  local log="$1" pid
  shift
  printf '\n==== start %s ====\n' "$(date -Is)" >>"$log"
  (cd "$state" && exec setsid nohup "$@" </dev/null >>"$log" 2>&1) &
  pid=$!
  echo "$pid" >"$pidfile"
  say "started pid $pid, waiting up to ${timeout_s}s (log: $log)"
  wait_ready "$pid"
}

# service_main [EXTRA_USAGE] -- "$@": the commands every service script has (install, start, stop,
# status: `running (pid P) $address`); a script with more handles those before calling this.
service_main() {
  local extra="$1"
  shift 2
  case "${1:-}" in
    install) do_install ;;
    start) do_start ;;
    stop) do_stop ;;
    status)
      if pid_alive; then echo "running (pid $(cat "$pidfile")) $address"; exit 0; fi
      echo "stopped"; exit 1
      ;;
    *)
      echo "usage: $0 {install|start|stop|status$extra}" >&2
      exit 2
      ;;
  esac
}

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
