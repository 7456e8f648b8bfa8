#!/usr/bin/env bash
# deploy/chromium.sh — Debian's headless Chromium and its ChromeDriver, for the live page's browser test
# (tests/integration/test_live_page.py drives them with selenium; nothing is downloaded by selenium).
#
#   deploy/chromium.sh install   apt-get install chromium chromium-driver (idempotent)
#   deploy/chromium.sh status    exit 0 if both are installed; prints their versions
set -euo pipefail

say() { echo "chromium: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=deploy/proc.sh
source "$(dirname "${BASH_SOURCE[0]}")/proc.sh"  # apt_install

installed() { [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; }

do_install() {
  if installed; then
    say "already installed: $(/usr/bin/chromium --version 2>/dev/null | head -1)"
    return 0
  fi
  apt_install --with-recommends chromium chromium-driver
  installed || die "installed, but /usr/bin/chromium or /usr/bin/chromedriver is missing"
}

case "${1:-}" in
  install) do_install ;;
  status)
    installed || die "not installed (run: $0 install)"
    /usr/bin/chromium --version; /usr/bin/chromedriver --version ;;
  *)
    echo "usage: $0 {install|status}" >&2
    exit 2 ;;
esac
