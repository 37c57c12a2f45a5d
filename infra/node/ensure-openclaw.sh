#!/usr/bin/env bash
# Installs the pinned `openclaw` npm package once into the project's cache and prints the
# directory that holds its node_modules (the CLI is node_modules/.bin/openclaw, run with the
# Node that ensure-node.sh prints). Progress goes to stderr; stdout is only the path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache="${LOOPWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/loopwarden}"
version="${LOOPWARDEN_OPENCLAW_VERSION:-2026.9.6}"
home="$cache/openclaw-$version"
if [ ! -f "$home/node_modules/openclaw/package.json" ]; then
  node_bin=$("$here/ensure-node.sh")
  npm_cli="$(dirname "$node_bin")/../lib/node_modules/npm/bin/npm-cli.js"
  [ -f "$npm_cli" ] || npm_cli=""
  echo "ensure-openclaw: installing openclaw@$version into $home (about 650 MB, once)" >&2
  mkdir -p "$cache"
  work=$(mktemp -d "$cache/.openclaw.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  echo '{"name": "loopwarden-openclaw-cache", "private": true}' > "$work/package.json"
  if [ -n "$npm_cli" ]; then
    (cd "$work" && PATH="$(dirname "$node_bin"):$PATH" "$node_bin" "$npm_cli" install --silent --no-audit --no-fund "openclaw@$version" >&2)
  else
    (cd "$work" && PATH="$(dirname "$node_bin"):$PATH" npm install --silent --no-audit --no-fund "openclaw@$version" >&2)
  fi
  rm -rf "$home"
  mv "$work" "$home"
  trap - EXIT
fi
echo "$home"
