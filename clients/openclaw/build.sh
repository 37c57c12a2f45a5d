#!/usr/bin/env bash
# Builds the OpenClaw plugin with the Node that runs OpenClaw: npm dependencies (again only when
# package-lock.json changed), the pinned `openclaw` package linked in for its types, then tsc; then
# stages the plugin as a gateway loads it in pack/: the files `npm pack` ships and the production
# dependencies only. OpenClaw copies and hashes a linked plugin's whole folder each time it loads
# it (three times per `openclaw agent` run), so leaving out the compiler and the type packages
# starts a gateway seconds sooner.
# Progress goes to stderr; stdout is only pack/'s path, ready for plugins.load.paths.
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

mkdir -p pack
if [ ! -f pack/node_modules/.package-lock.json ] || [ package-lock.json -nt pack/node_modules/.package-lock.json ]; then
  echo "build: production dependencies in $here/pack" >&2
  cp package.json package-lock.json pack/
  (cd pack && npm ci --omit=dev --omit=peer --no-audit --no-fund --silent >&2)
fi
tarball=$(npm pack --silent --pack-destination pack)
find pack -mindepth 1 -maxdepth 1 ! -name node_modules ! -name "$tarball" -exec rm -rf {} +
tar -xzf "pack/$tarball" -C pack --strip-components=1
rm "pack/$tarball"
echo "$here/pack"
