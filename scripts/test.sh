#!/usr/bin/env bash
# Installs everything torchport's tests need, then runs all of them (lint and types included).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: bubblewrap (the sandbox's outer layer), Chromium (browser tests),
# docker-compose and kubectl (offline validation of the compose file and Kubernetes
# manifests), g++ (the AOTInductor target compiles C++), zip and curl (the commands of
# docs/huggingface.md, which tests/cli/test_walkthrough.py runs).
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v chromium >/dev/null || need+=(chromium)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v kubectl >/dev/null || need+=(kubernetes-client)
command -v g++ >/dev/null || need+=(g++)
command -v zip >/dev/null || need+=(zip)
command -v curl >/dev/null || need+=(curl)
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
# diffusers, peft: the real-model and adapter tests need them) asks for no torch but any
# >= 2.0 (peft, accelerate), which the one installed meets, and timm and torchvision are
# not in it: pip would take timm's torchvision from PyPI, built for (and pulling in) a
# CUDA torch. `pip install --dry-run -e '.[test,models]'` lists only torchport.
pip install -q torch==2.13.0
# `all`: the models and targets extras and what ExecuTorch imports (the README's set-up).
pip install -q -e '.[test,all]'
# ExecuTorch without its declared dependencies (coremltools, pandas, scikit-learn, … and
# torch itself): what it needs to convert and run is in `all` (docs/targets.md).
pip install -q --no-deps executorch==1.4.1 torchao==0.18.0
if (($#)); then
  exec python -m pytest -q -p no:cacheprovider "$@"
fi
# The quick checks first (scripts/check.sh): a lint or layering slip is reported in a
# minute, not after the suite.
bash scripts/check.sh
# Then all tests, in two pytest runs side by side: the engine's and the API's tests (no
# sandbox; the API's each in a database and Redis prefix of their own) beside the rest,
# which runs as one, since sandboxes, servers, workers and the browser share the
# machine's sandbox slots and job uids. `-m "not slow"` is the fast lane.
CHECKED=(tests/test_quality.py tests/test_layering.py tests/test_contract_doc.py
  tests/test_docs_are_references.py)
PARALLEL=(tests/engine tests/service tests/schemas tests/cli/test_summary.py)
log=$(mktemp)
python -m pytest -q -p no:cacheprovider --durations=25 "${PARALLEL[@]}" >"$log" 2>&1 &
engine=$!
rest=0
python -m pytest -q -p no:cacheprovider --durations=25 tests "${PARALLEL[@]/#/--ignore=}" \
  "${CHECKED[@]/#/--ignore=}" || rest=$?
engine_rc=0
wait "$engine" || engine_rc=$?
echo "--- the engine's and the API's tests (run beside the above) ---"
cat "$log"
rm -f "$log"
if ((rest || engine_rc)); then
  echo "tests failed: the engine's and the API's exit $engine_rc, the rest exit $rest" >&2
  exit 1
fi
