#!/usr/bin/env bash
# Build the real MinIO server used by the remote-bucket tests (tests/providers/)
# and bench/remote.py, from source via the Go module proxy, into
# ~/.cache/sluice/bin/minio.
#
# Idempotent and cached like scripts/k8s-tools.sh: a binary whose version
# stamp (bin/.minio.version) matches MINIO_VERSION is not rebuilt, and
# GOCACHE/GOMODCACHE live under ~/.cache/sluice/go (shared with k8s-tools), so
# a rebuild after a version bump is incremental.  Needs only `go` on PATH.
#
# MinIO tags releases as RELEASE.<date> (not semver), so the module proxy
# knows them as pseudo-versions; MINIO_VERSION pins one of those.
# Cold build: ~10 min on 2 cores (see docs/remote.md).
#
# Env overrides: MINIO_VERSION, SLUICE_CACHE, MINIO_BUILD_JOBS (go build -p,
# default 2).
set -euo pipefail

MINIO_VERSION="${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
BIN="$CACHE/bin"
JOBS="${MINIO_BUILD_JOBS:-2}"

export GOCACHE="$CACHE/go/cache"
export GOMODCACHE="$CACHE/go/mod"
export GOFLAGS="-trimpath -buildvcs=false"
export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"

command -v go >/dev/null || { echo "minio: 'go' not found on PATH" >&2; exit 1; }
mkdir -p "$BIN" "$GOCACHE" "$GOMODCACHE"

if [[ -x "$BIN/minio" && -f "$BIN/.minio.version" && "$(cat "$BIN/.minio.version")" == "$MINIO_VERSION" ]]; then
  echo "[minio] $MINIO_VERSION up to date in $BIN"
  exit 0
fi

# CPU seconds (user+sys) of this shell's finished children, the portable figure of a
# cold build (its wall time depends on the load): cpu VAR sets VAR.
TCK="$(getconf CLK_TCK)"
cpu() {
  local -a f
  read -ra f <"/proc/$BASHPID/stat"
  printf -v "$1" '%d' $(((f[15] + f[16]) / TCK))
}
t=$SECONDS
cpu c0
echo "[minio] building github.com/minio/minio@$MINIO_VERSION (cold build: ~10 min on 2 cores)"
tmp="$(mktemp -d "$CACHE/build.minio.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" go install -p "$JOBS" -ldflags="-s -w" "github.com/minio/minio@$MINIO_VERSION"
mv -f "$tmp/minio" "$BIN/minio"
echo "$MINIO_VERSION" >"$BIN/.minio.version"
cpu c1
echo "[minio] done in $((SECONDS - t))s ($((c1 - c0)) CPU-s): $BIN/minio"
