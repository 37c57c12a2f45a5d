#!/usr/bin/env bash
# Builds the OpenClaw plugin with the Node that runs OpenClaw: npm dependencies (again only when
# package-lock.json changed), the pinned `openclaw` package linked in for its types, then tsc.
# Progress goes to stderr; stdout is only the plugin's directory, ready for plugins.load.paths.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
infra="$here/../../infra/node"
node_bin=$("$infra/ensure-node.sh")
openclaw_home=$("$infra/ensure-openclaw.sh")
export PATH="$(dirname "$node_bin"):$PATH"
npm_cli="$(dirname "$node_bin")/../lib/node_modules/npm/bin/npm-cli.js"
npm() { if [ -f "$npm_cli" ]; then "$node_bin" "$npm_cli" "$@"; else command npm "$@"; fi; }
cd "$here"
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "build: npm ci in $here" >&2
  npm ci --no-audit --no-fund --silent >&2
fi
ln -sfn "$openclaw_home/node_modules/openclaw" node_modules/openclaw
npm run --silent build >&2
echo "$here"
