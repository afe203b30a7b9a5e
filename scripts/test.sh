#!/usr/bin/env bash
# Installs everything torchport's tests need, then runs all of them (lint and types included).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: bubblewrap (the sandbox's outer layer), Chromium (browser tests),
# docker-compose and kubectl (offline validation of the compose file and Kubernetes
# manifests), g++ (the AOTInductor target compiles C++).
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v chromium >/dev/null || need+=(chromium)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v kubectl >/dev/null || need+=(kubernetes-client)
command -v g++ >/dev/null || need+=(g++)
if ((${#need[@]})); then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing system packages (install them as root): ${need[*]}" >&2
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
# torch first; nothing after it may replace it. The `models` extra (transformers,
# diffusers: the real-model tests need them) names no torch, and timm and torchvision are
# not in it: pip would take timm's torchvision from PyPI, built for (and pulling in) a
# CUDA torch. `pip install --dry-run -e '.[test,models]'` lists only torchport.
pip install -q torch==2.13.0
pip install -q -e '.[test,models,targets]'
# ExecuTorch without its declared dependencies (coremltools, pandas, scikit-learn, … and
# torch itself): what it needs to convert and run, pinned (docs/targets.md).
pip install -q --no-deps executorch==1.4.1 torchao==0.18.0
pip install -q ruamel.yaml==0.19.1 tabulate==0.10.0
# Two xdist workers: the engine's tests run beside the rest, which keeps to one worker
# (tests/conftest.py: sandboxes, servers and the browser share the machine).
python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup "$@"
