#!/usr/bin/env bash
# Bundles the browser pages' third-party libraries (cytoscape + cytoscape-dagre) into
# service/web/static/vendor.js with esbuild. The bundle is committed, so the Python package
# serves the pages without npm; run this only after changing web/package.json.
# node_modules lives outside the repository (TORCHPORT_WEB_BUILD_DIR), so nothing untracked
# is left in the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${TORCHPORT_WEB_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/torchport-web}
mkdir -p "$build"
cp web/package.json web/vendor.js "$build/"
if [ -f web/package-lock.json ]; then
  cp web/package-lock.json "$build/"
  (cd "$build" && npm ci --no-audit --no-fund --loglevel=error)
else
  (cd "$build" && npm install --no-audit --no-fund --loglevel=error)
  cp "$build/package-lock.json" web/package-lock.json
fi
versions=$(cd "$build" && node -e '
  const p = require("./package.json");
  const v = {};
  for (const name of Object.keys(p.dependencies)) v[name] = require(`./node_modules/${name}/package.json`).version;
  process.stdout.write(JSON.stringify(v));
')
banner="/* torchport vendor bundle: $versions (MIT licensed; licenses at the end) */"
(cd "$build" && ./node_modules/.bin/esbuild vendor.js --bundle --format=esm --minify \
  --legal-comments=eof --target=es2020 \
  --define:VENDOR_VERSIONS="$versions" \
  --banner:js="$banner" \
  --outfile="$root/service/web/static/vendor.js")
# cytoscape's licence text travels with the bundle (esbuild keeps only /*! comments).
{
  echo "Third-party code bundled in vendor.js"
  for name in cytoscape cytoscape-dagre; do
    echo
    echo "== $name $(cd "$build" && node -p "require('./node_modules/$name/package.json').version") =="
    cat "$build/node_modules/$name/LICENSE"
  done
} > service/web/static/vendor.LICENSE.txt
echo "wrote service/web/static/vendor.js ($versions)"
