#!/usr/bin/env bash
# The browser tests drive Debian's Chromium through Playwright (Playwright's own browser download
# is not used). Install it when it is missing.
set -euo pipefail
chromium=${FLEETDECK_CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "No $chromium and no apt-get: install Chromium and set FLEETDECK_CHROMIUM to its path." >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "Installing Debian's chromium for the browser tests…"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
