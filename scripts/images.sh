#!/usr/bin/env bash
# `make images`: build Sluice's three container images with no registry.
#
#   bash scripts/images.sh [server|runtime|operator ...]   (default: all three; 'base': the base only)
#
# 1. Installs what it needs from Debian's packages when missing (podman,
#    buildah, runc, mmdebstrap, skopeo, containernetworking-plugins).
# 2. Base image localhost/sluice/python-base:3.11-bookworm: a minbase rootfs
#    made by mmdebstrap from Debian bookworm's packages (python3, python3-venv,
#    python3-pip, ca-certificates), imported with `podman import`, plus the
#    images/base/Containerfile layer (`python3 -m venv /usr/local`) that makes
#    it look like the official python image to the Dockerfiles.
# 3. images/{server,runtime,operator}/Dockerfile built with
#    --build-arg BASE_IMAGE=<that base> (their default stays the official
#    python:3.11.13-slim-bookworm), tagged localhost/sluice/<name>:dev in the
#    local podman/buildah store (/var/lib/containers/storage).
#
# Everything is cached by content. An image's key is the sha256 of its
# Dockerfile, its build arguments, every file of the build context that
# .dockerignore lets through, and the base image's id; the base's key is the
# sha256 of its recipe (the mmdebstrap line below + images/base/Containerfile).
# A run whose keys match the stamps (and whose images are still in the store)
# builds nothing and takes seconds. The dependencies are the versions of
# uv.lock, exported to images/locked/*.txt (`make lock`; `make lint` checks
# them). Within a build, buildah's layer cache (--layers) reuses the
# dependency wheels while those files are unchanged,
# and the server and operator images share their dependency layers.
#
# Contract for other tools (e.g. `ctr -n k8s.io images import`):
#   $SLUICE_IMAGES_CACHE (default ~/.cache/sluice/images)/
#     index.json            {"images": {"server": {"ref": "localhost/sluice/server:dev",
#                            "id": "<podman image id>", "archive": "<abs path>",
#                            "format": "docker-archive", "key": "<content key>"}, ...}}
#     archives/<name>-<key12>.tar   docker-archive of the image, tagged with its ref
#     archives/<name>.tar           symlink to the current one
#     stamps/<name>                 "<key> <image id>" of the last build
#   index.json is rewritten (atomically) at the end of every run and lists
#   every image built so far; an archive never changes once written.
#
# Settings (environment): SLUICE_IMAGES_TORCH=none|cpu (runtime image's torch;
# default none: PyTorch's CPU index is not reachable everywhere), SLUICE_IMAGES_TAG
# (default dev), SLUICE_BASE_IMAGE (skip the local base and build FROM this
# image, e.g. python:3.11.13-slim-bookworm where a registry is reachable),
# SLUICE_IMAGES_CACHE. Two checkouts on one machine share the refs and the
# stamps: each run builds its own checkout's images again when the other
# built last (give one its own SLUICE_IMAGES_TAG and SLUICE_IMAGES_CACHE).
#
# Known traps on these machines, handled here: pip inside a build reaches the
# package index only with the host's CA bundle (/etc/ssl/certs is mounted
# read-only into every RUN); crun cannot start containers on this cgroup
# layout (--runtime runc).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${SLUICE_IMAGES_CACHE:-$HOME/.cache/sluice/images}
TAG=${SLUICE_IMAGES_TAG:-dev}
TORCH=${SLUICE_IMAGES_TORCH:-none}
BASE_REF=localhost/sluice/python-base:3.11-bookworm
ROOTFS_REF=localhost/sluice/debian-rootfs:bookworm
MIRROR=${SLUICE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${SLUICE_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
PACKAGES=python3,python3-venv,python3-pip,ca-certificates,passwd
ALL=(server runtime operator)

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

case "$TORCH" in none | cpu) ;; *) die "SLUICE_IMAGES_TORCH must be none or cpu, not '$TORCH'" ;; esac
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${ALL[@]}")
only_base=0
if [ "${names[*]}" = base ]; then only_base=1; names=(); fi
for name in "${names[@]}"; do
  [ -f "$REPO/images/$name/Dockerfile" ] || die "no images/$name/Dockerfile (images: ${ALL[*]})"
done

# --- tools ------------------------------------------------------------------
apt_get() {
  # Another apt may hold the lock (other builds on the machine): wait for it.
  local try
  for try in $(seq 1 60); do
    if DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 "$@"; then
      return 0
    fi
    log "apt-get $1 failed (try $try), retrying in 10 s"
    sleep 10
  done
  return 1
}

ensure_tools() {
  local missing=() tool
  for tool in podman buildah runc mmdebstrap skopeo; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  [ -d /usr/lib/cni ] || missing+=(containernetworking-plugins)
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "missing ${missing[*]}; run as root (apt-get install) or install them"
  log "installing ${missing[*]}"
  apt_get update
  apt_get install -y podman buildah runc mmdebstrap skopeo containernetworking-plugins uidmap
}

# --- content keys -----------------------------------------------------------
sha() { sha256sum | cut -d' ' -f1; }

context_files() {
  # The files .dockerignore lets into the build context: it is an allow-list
  # ('*' then '!path' lines) with exclusions like **/__pycache__/.
  local allow=() line
  while IFS= read -r line; do
    case "$line" in '!'*) allow+=("${line#!}") ;; esac
  done < <(grep -v '^[[:space:]]*#' "$REPO/.dockerignore")
  (cd "$REPO" && for path in "${allow[@]}"; do
    path=${path%/}
    if [ -e "$path" ]; then
      find "$path" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*'
    fi
  done) | LC_ALL=C sort
}

context_key() {
  (cd "$REPO" && context_files | while IFS= read -r f; do
    printf '%s %s\n' "$(sha256sum <"$f" | cut -d' ' -f1)" "$f"
  done; sha256sum <.dockerignore) | sha
}

stamp_ok() {  # stamp_ok NAME KEY REF -> 0 when the stamped build is still in the store
  local stamp="$CACHE/stamps/$1" key id
  [ -f "$stamp" ] || return 1
  read -r key id <"$stamp"
  [ "$key" = "$2" ] || return 1
  [ "$(podman image inspect --format '{{.Id}}' "$3" 2>/dev/null)" = "$id" ]
}

# --- base image -------------------------------------------------------------
# shellcheck disable=SC2016  # "$1" is the hook's argument (the rootfs), not ours
mmdebstrap_args=(
  --variant=minbase --include="$PACKAGES" --format=tar
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*'
  bookworm
)

build_base() {
  local key
  key=$( (printf '%s\n' "${mmdebstrap_args[@]}" "$MIRROR" "$SECURITY"
    cat "$REPO/images/base/Containerfile") | sha)
  if stamp_ok base "$key" "$BASE_REF"; then
    log "base $BASE_REF cached"
    return 0
  fi
  local rootfs="$CACHE/base/rootfs-${key:0:12}.tar" start=$SECONDS
  mkdir -p "$CACHE/base"
  log "base: mmdebstrap bookworm ($PACKAGES)"
  mmdebstrap "${mmdebstrap_args[@]}" "$rootfs.part" \
    "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
    "deb $SECURITY bookworm-security main"
  mv "$rootfs.part" "$rootfs"
  podman import --quiet --change 'CMD ["bash"]' "$rootfs" "$ROOTFS_REF" >/dev/null
  rm -f "$rootfs"
  log "base: venv layer (images/base/Containerfile)"
  buildah bud --quiet --layers --runtime runc --pull-never \
    --build-arg ROOTFS="$ROOTFS_REF" -f "$REPO/images/base/Containerfile" -t "$BASE_REF" \
    "$REPO/images/base" >/dev/null
  printf '%s %s\n' "$key" "$(podman image inspect --format '{{.Id}}' "$BASE_REF")" \
    >"$CACHE/stamps/base"
  log "base built in $((SECONDS - start)) s"
}

# --- the project's images ---------------------------------------------------
stage_text() {  # stage_text DOCKERFILE STAGE -> the instructions of one named stage
  awk -v stage="$2" 'toupper($1) == "FROM" { on = (tolower($3) == "as" && $4 == stage) } on' "$1"
}

buildah_dockerfile() {  # buildah_dockerfile NAME -> path of the Dockerfile buildah builds
  # buildah 1.28 (Debian 12) failed to bind-mount a stage taken whole from an
  # earlier run's layer cache ("couldn't find .../merged/dist", like
  # containers/buildah#4375), so the copy built here ends the stages that
  # RUN --mount reads (deps, app) with a LABEL that differs on every run; the
  # layers before it stay cached.
  local out="$CACHE/build/$1.Dockerfile"
  awk -v nonce="$1-$BUILD_NONCE" '
    function close_stage() { if (stage == "deps" || stage == "app") print "LABEL dev.sluice.build-nonce=" nonce }
    toupper($1) == "FROM" { close_stage(); stage = (tolower($3) == "as") ? $4 : "" }
    { print }
    END { close_stage() }' "$REPO/images/$1/Dockerfile" >"$out"
  printf '%s\n' "$out"
}

build_args() {  # build_args NAME -> one --build-arg per line
  local dockerfile="$REPO/images/$1/Dockerfile" extra=() deps source
  [ "$1" != runtime ] || extra=("--build-arg=TORCH=$TORCH")
  # buildah reuses a cached RUN --mount=from=STAGE layer even when STAGE
  # changed (containers/buildah#4522): these two keep the final stage honest.
  deps=$( (stage_text "$dockerfile" deps; cat "$REPO/pyproject.toml" "$REPO"/images/locked/*.txt; printf '%s\n' "${extra[@]}" "$BASE_ID") | sha)
  source=$( (stage_text "$dockerfile" app; printf '%s\n' "$CONTEXT_KEY" "$BASE_ID") | sha)
  printf -- '%s\n' "--build-arg=BASE_IMAGE=$BASE" "${extra[@]}" \
    "--build-arg=DEPS_DIGEST=$deps" "--build-arg=SOURCE_DIGEST=$source"
}

build_image() {
  local name=$1 ref="localhost/sluice/$1:$TAG" key args start=$SECONDS
  mapfile -t args < <(build_args "$name")
  key=$( (cat "$REPO/images/$name/Dockerfile"; printf '%s\n' "${args[@]}" "$BASE_ID" "$CONTEXT_KEY") | sha)
  if stamp_ok "$name" "$key" "$ref" && [ -f "$CACHE/archives/$name-${key:0:12}.tar" ]; then
    log "$name $ref cached"
    return 0
  fi
  local old
  old=$(podman image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)
  log "$name: building $ref"
  buildah bud --layers --runtime runc --pull-never \
    --volume /etc/ssl/certs:/etc/ssl/certs:ro \
    "${args[@]}" -f "$(buildah_dockerfile "$name")" -t "$ref" "$REPO" \
    >"$CACHE/logs/$name.log" 2>&1 || {
    tail -n 40 "$CACHE/logs/$name.log" >&2
    die "building $ref failed (full log: $CACHE/logs/$name.log)"
  }
  local id archive="$CACHE/archives/$name-${key:0:12}.tar"
  id=$(podman image inspect --format '{{.Id}}' "$ref")
  # The image this one replaces: gone unless a container still uses it.
  [ -z "$old" ] || [ "$old" = "$id" ] || podman rmi "$old" >/dev/null 2>&1 || true
  log "$name: built in $((SECONDS - start)) s; saving $archive"
  rm -f "$archive.part"
  podman save --quiet --format docker-archive -o "$archive.part" "$ref"
  mv "$archive.part" "$archive"
  find "$CACHE/archives" -name "$name-*.tar" ! -name "$(basename "$archive")" -delete
  ln -sfn "$(basename "$archive")" "$CACHE/archives/$name.tar"
  printf '%s %s\n' "$key" "$id" >"$CACHE/stamps/$name"
  BUILT+=("$name")
  log "$name: done in $((SECONDS - start)) s"
}

write_index() {
  local name key id entries=() sep=""
  for name in "${ALL[@]}"; do
    [ -f "$CACHE/stamps/$name" ] || continue
    read -r key id <"$CACHE/stamps/$name"
    entries+=("$sep\"$name\": {\"ref\": \"localhost/sluice/$name:$TAG\", \"id\": \"$id\", \"archive\": \"$CACHE/archives/$name-${key:0:12}.tar\", \"format\": \"docker-archive\", \"key\": \"$key\"}")
    sep=", "
  done
  printf '{"images": {%s}}\n' "${entries[*]}" >"$CACHE/index.json.part"
  mv "$CACHE/index.json.part" "$CACHE/index.json"
}

main() {
  mkdir -p "$CACHE/stamps" "$CACHE/archives" "$CACHE/logs" "$CACHE/build"
  BUILD_NONCE="$(date +%s)-$$"
  BUILT=()
  exec 9>"$CACHE/.lock"
  flock 9  # one build at a time on this machine (make images, pytest sessions)
  local start=$SECONDS
  ensure_tools
  if [ -n "${SLUICE_BASE_IMAGE:-}" ]; then
    BASE=$SLUICE_BASE_IMAGE
  else
    build_base
    BASE=$BASE_REF
  fi
  [ "$only_base" = 0 ] || { log "base done in $((SECONDS - start)) s"; return 0; }
  BASE_ID=$(podman image inspect --format '{{.Id}}' "$BASE") \
    || die "base image $BASE is not in the local store (podman pull it first)"
  CONTEXT_KEY=$(context_key)
  for name in "${names[@]}"; do
    build_image "$name"
  done
  write_index
  # The stage ends of earlier builds (buildah_dockerfile) of the images built now
  # are never used again. Only those: the stage end of an image this run found
  # cached is what keeps its stages' layers (the runtime's wheels: minutes of
  # pip) in the layer cache for its next build. (Labels that start with a digit
  # name no image: written before this rule, they go too.)
  local built
  for built in "${BUILT[@]}"; do
    podman images --all --filter "label=dev.sluice.build-nonce" \
      --format '{{.ID}} {{index .Labels "dev.sluice.build-nonce"}}' |
      awk -v name="$built-" -v nonce="$built-$BUILD_NONCE" \
        '(index($2, name) == 1 && $2 != nonce) || $2 ~ /^[0-9]/ { print $1 }' |
      xargs -r podman rmi >/dev/null 2>&1 || true
  done
  log "all done in $((SECONDS - start)) s: $CACHE/index.json"
}

# One line: bash reads a script as it runs, so an edit during a build cannot
# make it run half-old, half-new lines after main returns.
main "$@"; exit $?
