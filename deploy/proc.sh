# deploy/proc.sh — process handling shared by the service scripts (sourced, not run).
#
# The caller sets: pidfile (where the pid lives), config (a path that appears in our
# process's command line, so a reused pid or a system-wide server is never taken for
# ours) and defines say().

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
