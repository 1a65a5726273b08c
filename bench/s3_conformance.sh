#!/usr/bin/env bash
# Ceph's s3-tests (the standard boto3 S3 conformance suite) against a fresh `sluice up` and,
# on the same scope, the project's MinIO: pass counts and the failures of each.
# Not part of `make test`; docs/s3-api.md, "Conformance", has the figures and the scope.
#
#   bench/s3_conformance.sh S3TESTS_DIR [sluice|minio|both]     (default: both)
#
# S3TESTS_DIR: a checkout of https://github.com/ceph/s3-tests (this script fetches nothing).
# S3TESTS_PYTHON: a Python with the suite's requirements plus pytest-xdist and pytest-timeout,
#   kept apart from the project's .venv, e.g.
#     python3 -m venv /tmp/s3t && /tmp/s3t/bin/pip install -r S3TESTS_DIR/requirements.txt \
#       pytest-xdist pytest-timeout
# S3TESTS_JOBS (default 2), S3TESTS_TIMEOUT (seconds per test, default 300),
# S3TESTS_OUT (results: junit XML, logs; default a new temp dir).
set -euo pipefail

SUITE="${1:?usage: $0 S3TESTS_DIR [sluice|minio|both]}"
WHICH="${2:-both}"
PY="${S3TESTS_PYTHON:?set S3TESTS_PYTHON to a Python with the suite installed}"
JOBS="${S3TESTS_JOBS:-2}"
TIMEOUT="${S3TESTS_TIMEOUT:-300}"
OUT="${S3TESTS_OUT:-$(mktemp -d /tmp/s3-conformance.XXXXXX)}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MINIO="${SLUICE_CACHE:-$HOME/.cache/sluice}/bin/minio"
TESTS="$SUITE/s3tests/functional/test_s3.py"
[[ -f "$TESTS" ]] || TESTS="$SUITE/s3tests_boto3/functional/test_s3.py"
[[ -f "$TESTS" ]] || { echo "no s3tests functional/test_s3.py under $SUITE" >&2; exit 1; }
mkdir -p "$OUT"

# Out of the declared scope (docs/s3-api.md): by keyword, matched against the test names.
# ACLs, policies, versioning (and conditional writes on versioned buckets), lifecycle,
# SSE/KMS, object lock, tagging, CORS, website, bucket logging, browser POST uploads,
# ownership controls, public access blocks, torrents, restore/cloud tiers,
# GetObjectAttributes, delete markers, IAM/STS, tenants, RGW usage stats, storage
# classes, expected-bucket-owner, conditional deletes.
OUT_OF_SCOPE="acl or policy or versioning or versioned or version or lifecycle or sse \
or encrypt or encrypted or copy_part_enc or copy_enc or obj_enc or kms or object_lock \
or tagging or tags or cors or website or logging or post_object or ownership \
or public_block or block_public or torrent or restore or read_through \
or object_attributes or delete_marker or iam or tenant or usage or storage_class \
or cloud or expected_bucket_owner or current_object_if or object_current_if \
or (delete_object and if_match) or (delete_objects and if_match)"

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

conf() { # name port access secret alt-access alt-secret
  cat >"$OUT/$1.conf" <<EOF
[DEFAULT]
host = 127.0.0.1
port = $2
is_secure = False
ssl_verify = False
[fixtures]
bucket prefix = s3t-{random}-
[s3 main]
display_name = main
user_id = main
email = main@example.com
access_key = $3
secret_key = $4
[s3 alt]
display_name = alt
user_id = alt
email = alt@example.com
access_key = $5
secret_key = $6
[s3 tenant]
display_name = tenant
user_id = tenant
email = tenant@example.com
access_key = $3
secret_key = $4
tenant = testx
[iam]
email = iam@example.com
user_id = iam
display_name = iam
access_key = $3
secret_key = $4
[iam root]
access_key = $3
secret_key = $4
user_id = root
email = root@example.com
[iam alt root]
access_key = $3
secret_key = $4
user_id = altroot
email = altroot@example.com
EOF
}

run_suite() { # name
  echo "[s3-conformance] $1: s3-tests at $(git -C "$SUITE" rev-parse HEAD 2>/dev/null || echo '?')"
  (cd "$SUITE" && S3TEST_CONF="$OUT/$1.conf" "$PY" -m pytest -q -p no:cacheprovider \
    -n "$JOBS" --timeout "$TIMEOUT" "$TESTS" -k "not ($OUT_OF_SCOPE)" \
    --junitxml="$OUT/$1.xml" -rfE >"$OUT/$1.log" 2>&1) || true
  tail -1 "$OUT/$1.log"
}

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -- "-$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_http() { for _ in $(seq 120); do curl -s -o /dev/null "$1" && return 0; sleep 1; done; return 1; }

if [[ "$WHICH" == sluice || "$WHICH" == both ]]; then
  port=$(free_port)
  setsid "$ROOT/.venv/bin/sluice" up --targets 3 --port "$port" --host 127.0.0.1 \
    --data-dir "$OUT/sluice-data" >"$OUT/sluice-up.log" 2>&1 &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$port/" || { echo "sluice up did not start" >&2; exit 1; }
  key() { curl -s -X POST "http://127.0.0.1:$port/v1/s3/keys" -H 'content-type: application/json' \
    -d '{"permission":"write"}' | "$PY" -c 'import json,sys; k=json.load(sys.stdin); print(k["access_key"], k["secret_key"])'; }
  read -r a1 s1 < <(key)
  read -r a2 s2 < <(key)
  conf sluice "$port" "$a1" "$s1" "$a2" "$s2"
  run_suite sluice
fi

if [[ "$WHICH" == minio || "$WHICH" == both ]]; then
  [[ -x "$MINIO" ]] || { echo "MinIO is not built ($MINIO): make minio" >&2; exit 1; }
  port=$(free_port)
  mkdir -p "$OUT/minio-data"
  MINIO_ROOT_USER=s3conformance MINIO_ROOT_PASSWORD=s3conformance-secret MINIO_BROWSER=off \
    setsid "$MINIO" server --address "127.0.0.1:$port" --console-address "127.0.0.1:$(free_port)" \
    "$OUT/minio-data" >"$OUT/minio.log" 2>&1 &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$port/minio/health/live" || { echo "minio did not start" >&2; exit 1; }
  conf minio "$port" s3conformance s3conformance-secret s3conformance s3conformance-secret
  run_suite minio
fi

echo "[s3-conformance] results in $OUT"
