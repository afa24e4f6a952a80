#!/usr/bin/env bash
# Installs the system packages the test suite drives for real (PostgreSQL server, Chromium)
# when they are missing. Services themselves are started and stopped by the tests, by PID.
set -euo pipefail
need=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
# The explorer's browser tests drive Debian's Chromium through Playwright (never `playwright install`).
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing system packages for the tests: ${need[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing system packages: ${need[*]} (run as root or install them: tests needing them will skip)" >&2
  fi
fi
