#!/usr/bin/env bash
# `make tools`: everything the suite needs besides the venv, at once.
#
# Two lanes side by side:
#   Go lane:     scripts/k8s-tools.sh, then scripts/minio.sh, then
#                scripts/fake-gcs.sh (compilers: CPU). It needs no Debian
#                package (only `go`), so it starts at once, beside step 1 below.
#   images lane: 1. one apt-get for every Debian package the other scripts
#                would install (each of them checks again and finds its
#                packages there): apt's lock allows one install at a time, and
#                one `apt-get update` is enough; 2. scripts/images.sh, then
#                scripts/browser.sh, then scripts/azurite.sh (downloads, pip
#                inside buildah, npm: mostly waiting on the network and the disk).
# On a cold 2-core machine the images lane hides under the Go lane instead
# of adding its minutes before or after it (docs/testing-kubernetes.md, "What `make test` costs").
#
# Every step is cached by version or content, so a warm run takes seconds.
# The scripts stay usable alone (make k8s-tools, make minio, make fake-gcs,
# make images, make browser, make azurite). SLUICE_NO_APT=1 skips step 1 (and the scripts' own apt steps).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
t0=$SECONDS
log() { printf '[tools %4ss] %s\n' "$((SECONDS - t0))" "$*" >&2; }

# --- the Go lane: at once (the Debian packages are step 1's, so not its own apt step)
(
  export SLUICE_NO_APT=1
  bash "$ROOT/scripts/k8s-tools.sh" && bash "$ROOT/scripts/minio.sh" && bash "$ROOT/scripts/fake-gcs.sh"
) &
go_lane=$!

# --- the images lane: 1. Debian packages ----------------------------------------
debian_packages() {
  local pkgs=() pair try SUDO=""
  has() { command -v "$1" >/dev/null || [[ -x "/usr/sbin/$1" ]]; }
  for pair in podman buildah runc mmdebstrap skopeo containerd iptables conntrack; do
    has "$pair" || pkgs+=("$pair")
  done
  [[ -d /usr/lib/cni ]] || pkgs+=(containernetworking-plugins)
  has newuidmap || pkgs+=(uidmap)
  [[ -x "${SLUICE_CHROMIUM:-/usr/bin/chromium}" ]] || pkgs+=(chromium)
  ((${#pkgs[@]})) && [[ -z "${SLUICE_NO_APT:-}" ]] && command -v apt-get >/dev/null || return 0
  [[ "$(id -u)" == 0 ]] || SUDO=sudo
  log "installing ${pkgs[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  for try in 1 2 3 4 5 6; do $SUDO apt-get update -q >/dev/null && break; sleep 10; done
  $SUDO apt-get install -y -q -o DPkg::Lock::Timeout=600 "${pkgs[@]}" >/dev/null || return 1
  log "Debian packages installed"
}

# --- 2. the images (a failure here still waits for the Go lane) ------------------
images_rc=0
{
  debian_packages && bash "$ROOT/scripts/images.sh" && bash "$ROOT/scripts/browser.sh" &&
    bash "$ROOT/scripts/azurite.sh"
} || images_rc=$?
log "images lane done (exit $images_rc); waiting for the Go lane"
go_rc=0
wait "$go_lane" || go_rc=$?
log "done: Go lane exit $go_rc, images lane exit $images_rc"
exit $((go_rc ? go_rc : images_rc))
