#!/usr/bin/env bash
# Build fake-gcs-server, the GCS emulator of the gcp:// remote-bucket tests
# (tests/providers/) and bench/remote.py, from source via the Go module proxy,
# into ~/.cache/sluice/bin/fake-gcs-server.
#
# Cached like scripts/minio.sh: a binary whose stamp
# (bin/.fake-gcs-server.version) matches FAKE_GCS_VERSION is not rebuilt, and
# GOCACHE/GOMODCACHE live under ~/.cache/sluice/go (shared with minio.sh and
# k8s-tools.sh). Cold build: about 2 min on 2 cores. Needs only `go` on PATH.
#
# Env overrides: FAKE_GCS_VERSION, SLUICE_CACHE, FAKE_GCS_BUILD_JOBS (go build
# -p, default 2).
set -euo pipefail

FAKE_GCS_VERSION="${FAKE_GCS_VERSION:-v1.56.1}"
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
BIN="$CACHE/bin"
JOBS="${FAKE_GCS_BUILD_JOBS:-2}"

export GOCACHE="$CACHE/go/cache"
export GOMODCACHE="$CACHE/go/mod"
export GOFLAGS="-trimpath -buildvcs=false"
export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"

command -v go >/dev/null || { echo "fake-gcs: 'go' not found on PATH" >&2; exit 1; }
mkdir -p "$BIN" "$GOCACHE" "$GOMODCACHE"

stamp="$BIN/.fake-gcs-server.version"
if [[ -x "$BIN/fake-gcs-server" && -f "$stamp" && "$(cat "$stamp")" == "$FAKE_GCS_VERSION" ]]; then
  echo "[fake-gcs] $FAKE_GCS_VERSION up to date in $BIN"
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
echo "[fake-gcs] building github.com/fsouza/fake-gcs-server@$FAKE_GCS_VERSION"
tmp="$(mktemp -d "$CACHE/build.fake-gcs.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" go install -p "$JOBS" -ldflags="-s -w" \
  "github.com/fsouza/fake-gcs-server@$FAKE_GCS_VERSION"
mv -f "$tmp/fake-gcs-server" "$BIN/fake-gcs-server"
echo "$FAKE_GCS_VERSION" >"$stamp"
cpu c1
echo "[fake-gcs] done in $((SECONDS - t))s ($((c1 - c0)) CPU-s): $BIN/fake-gcs-server"
