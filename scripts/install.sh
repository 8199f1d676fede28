#!/usr/bin/env bash
# Create the virtualenv and install Fleetdeck with its pinned dependencies, test tools and the
# torch build the reference Serve application runs on.
set -euo pipefail
venv=${1:-.venv}
cd "$(dirname "$0")/.."

python=""
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    python=$candidate; break
  fi
done
if [ -z "$python" ]; then
  echo "Fleetdeck needs Python 3.11 (ray[serve] 2.60 and Django 5.2 are pinned for it)." >&2
  exit 1
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e ".[test,demo]"
