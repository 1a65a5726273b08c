#!/usr/bin/env bash
# Install Azurite, the Azure Blob emulator of the az:// remote-bucket tests
# (tests/providers/) and bench/remote.py, from npm into
# ~/.cache/sluice/tools/azurite (its launcher: node_modules/.bin/azurite-blob).
#
# Cached like scripts/minio.sh: an install whose stamp (.azurite.version)
# matches AZURITE_VERSION is kept. Needs `node` and `npm` on PATH (Node >= 18).
# Cold install: well under a minute, mostly download.
#
# Env overrides: AZURITE_VERSION, SLUICE_CACHE.
set -euo pipefail

AZURITE_VERSION="${AZURITE_VERSION:-3.35.0}"
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
DIR="$CACHE/tools/azurite"
BIN="$DIR/node_modules/.bin/azurite-blob"

command -v npm >/dev/null || { echo "azurite: 'npm' not found on PATH" >&2; exit 1; }
if [[ -x "$BIN" && -f "$DIR/.azurite.version" && "$(cat "$DIR/.azurite.version")" == "$AZURITE_VERSION" ]]; then
  echo "[azurite] $AZURITE_VERSION up to date in $DIR"
  exit 0
fi

t=$SECONDS
echo "[azurite] installing azurite@$AZURITE_VERSION from npm"
mkdir -p "$DIR"
npm install --prefix "$DIR" --no-audit --no-fund --omit=dev --loglevel=error \
  --cache "$CACHE/tools/npm-cache" "azurite@$AZURITE_VERSION" >/dev/null
[[ -x "$BIN" ]] || { echo "azurite: $BIN missing after npm install" >&2; exit 1; }
echo "$AZURITE_VERSION" >"$DIR/.azurite.version"
echo "[azurite] done in $((SECONDS - t))s: $BIN"
