#!/usr/bin/env bash
# Install the browser the status-page test (tests/ui/) drives: Chromium from
# Debian's packages. Playwright's own browser download cannot be used here
# (only package registries are reachable), so the test launches this binary.
#
# Idempotent: does nothing when $SLUICE_CHROMIUM (default /usr/bin/chromium)
# is already there. Needs root or sudo for apt-get.
set -euo pipefail

CHROMIUM="${SLUICE_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "scripts/browser.sh: no apt-get; install Chromium and set SLUICE_CHROMIUM to it" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "scripts/browser.sh: installing Chromium from the Debian packages" >&2
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
"$CHROMIUM" --version
