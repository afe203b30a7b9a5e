#!/usr/bin/env bash
# The quick checks (seconds to a minute or two): lint, format, types, generated schemas,
# error codes against the docs, the layering, and docs that are references. CI runs them
# before the tests; run them before every commit. Needs the environment scripts/test.sh
# installs (`.venv`).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x .venv/bin/python ]; then
  . .venv/bin/activate
fi
exec python -m pytest -q -p no:cacheprovider tests/test_quality.py \
  tests/test_layering.py tests/test_contract_doc.py tests/test_docs_are_references.py
