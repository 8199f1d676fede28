#!/usr/bin/env bash
# The alert rules in deploy/monitoring are tested with promtool, the Prometheus path of the readings
# against a Prometheus server (tests/integration/prometheus_server.py starts its own on loopback),
# both from Debian's prometheus package, and incidents sent to Alertmanager against Debian's
# prometheus-alertmanager (tests/integration/test_alertmanager.py starts its own). Install them when
# one is missing (the services the packages bring are not started).
set -euo pipefail
promtool=${FLEETDECK_PROMTOOL:-/usr/bin/promtool}
prometheus=${FLEETDECK_PROMETHEUS:-/usr/bin/prometheus}
alertmanager=${FLEETDECK_ALERTMANAGER:-/usr/bin/prometheus-alertmanager}
[ -x "$promtool" ] && [ -x "$prometheus" ] && [ -x "$alertmanager" ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "No $promtool, $prometheus or $alertmanager and no apt-get: install Prometheus (server and" \
    "promtool) and Alertmanager, and set FLEETDECK_PROMTOOL, FLEETDECK_PROMETHEUS and" \
    "FLEETDECK_ALERTMANAGER to their paths." >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "Installing Debian's prometheus and prometheus-alertmanager for the monitoring tests…"
$sudo apt-get update -qq
# The package's postinst would start a Prometheus: policy-rc.d tells it not to.
policy=/usr/sbin/policy-rc.d
created=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod +x "$policy" && created=1
fi
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null
[ -n "$created" ] && $sudo rm -f "$policy"
exit 0
