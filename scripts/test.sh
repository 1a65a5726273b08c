#!/usr/bin/env bash
# `make test`: the tools lane (scripts/tools.sh: the Go builds, the images) beside
# the venv, lint and pytest, instead of before pytest.
#
# On a cold machine the Go lane (Kubernetes, MinIO, fake-gcs-server, CoreDNS:
# compilers on both cores, about 22 min) was the floor before the first test.
# Now pytest starts as soon as lint is done: the tests that need none of the
# tools run first, beside the compilers (their workers wait on servers about
# half the time), and each test that needs a tool (tests/schedule.py,
# NEEDS_TOOLS) waits for the lane's exit code in $SLUICE_TOOLS_STATUS, and
# fails naming its log when the lane failed. On a warm machine the lane is done
# in seconds, before pytest has collected. Either failing fails `make test`.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MAKE="${MAKE:-make}"
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
mkdir -p "$CACHE"
status="$CACHE/tools.status"
log="$CACHE/tools.log"
rm -f "$status"

(
  bash scripts/tools.sh >"$log" 2>&1
  rc=$?
  echo "$rc" >"$status.tmp" && mv -f "$status.tmp" "$status"
) &
tools=$!
echo "make test: the tools lane runs beside the tests (log: $log)" >&2

$MAKE --no-print-directory lint  # install first (uv's downloads beside the compilers)
lint_rc=$?
pytest_rc=1
if ((lint_rc == 0)); then
  # .pyc files written (under .venv and __pycache__, git-ignored) even where
  # PYTHONDONTWRITEBYTECODE is set: else each of the suite's thousands of server,
  # transformer and CLI processes compiles every module it imports (Makefile, WRITE_PYC)
  env -u PYTHONDONTWRITEBYTECODE SLUICE_TOOLS_STATUS="$status" SLUICE_TOOLS_LOG="$log" \
    .venv/bin/pytest -q -n "${TEST_WORKERS:-2}" --dist loadgroup --durations=40 "$@"
  pytest_rc=$?  # --durations: the slowest, to keep the suite in budget
fi
wait "$tools"
tools_rc=$(cat "$status" 2>/dev/null || echo 1)
tail -n 5 "$log" >&2
if ((tools_rc != 0)); then
  echo "make test: the tools lane failed (exit $tools_rc); its log, $log:" >&2
  tail -n 60 "$log" >&2
fi
((lint_rc == 0 && pytest_rc == 0 && tools_rc == 0))
