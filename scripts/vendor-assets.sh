#!/usr/bin/env bash
# Re-fetch the vendored front-end assets from the npm registry (they are committed, so neither
# running nor testing Fleetdeck needs npm). Bump the version here and in the templates together.
# The source map comes along: the bundle names it, and collectstatic's manifest storage refuses a
# reference to a missing file.
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.6.1
work=$(mktemp -d)
(cd "$work" && npm pack "chart.js@$version" >/dev/null && tar xzf "chart.js-$version.tgz")
mkdir -p "static/vendor/chartjs-$version"
cp "$work/package/dist/chart.umd.min.js" "$work/package/dist/chart.umd.min.js.map" "$work/package/LICENSE.md" "static/vendor/chartjs-$version/"
rm -rf "$work"
echo "static/vendor/chartjs-$version updated"
