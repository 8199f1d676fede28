#!/usr/bin/env bash
# The alert rules in deploy/monitoring are tested with promtool, from Debian's prometheus package.
# Install it when it is missing (the Prometheus server it brings is not started: promtool is all the
# tests run).
set -euo pipefail
promtool=${FLEETDECK_PROMTOOL:-/usr/bin/promtool}
[ -x "$promtool" ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "No $promtool and no apt-get: install Prometheus's promtool and set FLEETDECK_PROMTOOL to its path." >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "Installing Debian's prometheus (for promtool) for the alert rules' tests…"
$sudo apt-get update -qq
# The package's postinst would start a Prometheus: policy-rc.d tells it not to.
policy=/usr/sbin/policy-rc.d
created=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod +x "$policy" && created=1
fi
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
[ -n "$created" ] && $sudo rm -f "$policy"
exit 0
