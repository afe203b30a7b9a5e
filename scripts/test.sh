#!/usr/bin/env bash
# Installs everything torchport's tests need, then runs all of them (lint and types included).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: bubblewrap for the sandbox's outer layer, Chromium for the browser tests.
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
if ((${#need[@]})); then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing system packages (install them as root): ${need[*]}" >&2
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q torch==2.13.0
pip install -q -e '.[test]'
python -m pytest -q -p no:cacheprovider "$@"
