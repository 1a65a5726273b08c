#!/usr/bin/env bash
# Build the real Kubernetes control-plane binaries used by the tests
# (tests/k8s/), from source via the Go module proxy, into ~/.cache/sluice/bin/.
#
#   kube-apiserver kube-controller-manager kube-scheduler kubectl  (k8s.io/kubernetes)
#   kubelet kube-proxy                                            (same build: shared cache)
#   etcd                                                          (go.etcd.io/etcd/server/v3)
#   helm                                                          (helm.sh/helm/v3)
#   coredns: the dev cluster's DNS (github.com/coredns/coredns), with only
#            the plugins it uses (tests/k8s/clusterdns.py)
#   pause and echo test images (tests/k8s/images/*, static Go on an empty
#   image, packed by tests/k8s/ociimage.py) into ~/.cache/sluice/k8s-images/
#
# and, for the real-node harness (tests/k8s/realnode.py), installs the node
# runtime with apt-get when it is missing: containerd, runc, the CNI plugins
# (containernetworking-plugins), iptables and conntrack (kube-proxy).
# SLUICE_NO_APT=1 skips that step (the harness then names what is missing).
#
# Idempotent and cached: a binary whose version stamp (bin/.<name>.version)
# matches is not rebuilt (helm's stamp also names the Kubernetes version baked
# into it, so a helm built for another Kubernetes, or without the version
# ldflags, is rebuilt); GOCACHE/GOMODCACHE live under ~/.cache/sluice/go so a
# rebuild after a version bump is incremental.  Needs only `go` on PATH.
#
# k8s.io/kubernetes (and etcd's server module) use `replace` directives that
# point at in-repo staging directories, so `go install pkg@version` refuses
# them.  We instead generate a throwaway module in ~/.cache/sluice/build/<name>
# that requires the main module and replaces every staging module by its
# published version, then `go build -o`.
#
# Env overrides: K8S_VERSION, ETCD_VERSION, HELM_VERSION, COREDNS_VERSION, SLUICE_CACHE,
# K8S_TOOLS_JOBS (go build -p, default 2).
# Each step logs its wall time and CPU seconds (user+sys of its processes).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.19.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
BIN="$CACHE/bin"
BUILD="$CACHE/build"
JOBS="${K8S_TOOLS_JOBS:-2}"
K8S_MINOR="${K8S_VERSION#v1.}"  # 34.4
K8S_MINOR="${K8S_MINOR%%.*}"    # 34

export GOCACHE="$CACHE/go/cache"
export GOMODCACHE="$CACHE/go/mod"
export GOFLAGS="-trimpath -buildvcs=false"
export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"

command -v go >/dev/null || { echo "k8s-tools: 'go' not found on PATH" >&2; exit 1; }
mkdir -p "$BIN" "$BUILD" "$GOCACHE" "$GOMODCACHE"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGES="$CACHE/k8s-images"

t_all=$SECONDS
log() { printf '[k8s-tools %4ss] %s\n' "$((SECONDS - t_all))" "$*"; }
# CPU seconds (user+sys) of this shell's finished children: a step's CPU is the
# difference, the portable figure of a cold build (wall time depends on the load).
# cpu VAR: VAR = those seconds so far, read with builtins only (a $(...) would be a
# subshell of its own, with no finished children).
TCK="$(getconf CLK_TCK)"
cpu() {
  local -a f
  read -ra f <"/proc/$BASHPID/stat"
  printf -v "$1" '%d' $(((f[15] + f[16]) / TCK))
}

# --- node runtime (Debian packages) ----------------------------------------
# crun cannot start containers on this cgroup layout; runc can (issue 24).
node_pkgs=()
for pair in containerd=containerd runc=runc /usr/lib/cni/bridge=containernetworking-plugins \
  iptables=iptables conntrack=conntrack; do
  cmd="${pair%%=*}"
  if [[ "$cmd" == /* ]]; then [[ -x "$cmd" ]] || node_pkgs+=("${pair#*=}")
  else command -v "$cmd" >/dev/null || [[ -x "/usr/sbin/$cmd" ]] || node_pkgs+=("${pair#*=}"); fi
done
if ((${#node_pkgs[@]})) && [[ -z "${SLUICE_NO_APT:-}" ]]; then
  t=$SECONDS
  log "installing ${node_pkgs[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  # Another build (make images) may hold apt's locks: wait for them.
  for try in 1 2 3 4 5 6; do apt-get update -q >/dev/null && break; sleep 10; done
  apt-get install -y -q -o DPkg::Lock::Timeout=900 --no-install-recommends "${node_pkgs[@]}" >/dev/null
  log "node packages installed in $((SECONDS - t))s"
else
  log "node runtime packages present${node_pkgs[*]:+ (missing, SLUICE_NO_APT set: ${node_pkgs[*]})}"
fi

# up_to_date NAME VERSION: binary exists and its stamp says VERSION.
up_to_date() {
  [[ -x "$BIN/$1" && -f "$BIN/.$1.version" && "$(cat "$BIN/.$1.version")" == "$2" ]]
}

# staging_replaces MODULE VERSION STAGING_VERSION: print one `replace` line per
# local-path replace directive in MODULE@VERSION's go.mod, pointing to the
# published module at STAGING_VERSION instead.
staging_replaces() {
  local gomod
  gomod="$(go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
  [[ -f "$gomod" ]] || { echo "k8s-tools: cannot fetch go.mod of $1@$2" >&2; return 1; }
  # Lines look like "	k8s.io/api => ./staging/src/k8s.io/api" (inside a
  # replace block) or "replace go.etcd.io/x => ../x".
  # etcd also "replaces" modules it must never depend on with ./FORBIDDEN_DEPENDENCY.
  awk '/=> *\.\.?\// && !/FORBIDDEN/ { sub(/^replace[ \t]+/, ""); sub(/^[ \t]+/, ""); print $1 }' "$gomod" |
    sort -u | while read -r mod; do
      echo "replace $mod => $mod $3"
    done
}

# gomodule NAME MODULE VERSION STAGING_VERSION: create the throwaway module dir.
gomodule() {
  local dir="$BUILD/$1"
  rm -rf "$dir" && mkdir -p "$dir"
  {
    echo "module sluice.local/build/$1"
    echo
    echo "go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')"
    echo
    echo "require $2 $3"
    [[ -n "$4" ]] && staging_replaces "$2" "$3" "$4"
  } >"$dir/go.mod"
  echo "$dir"
}

# build_pkgs DIR VERSION STAMP LDFLAGS name=pkg...: go build the packages of
# the module pinned at VERSION into $BIN, each with version stamp STAMP.
build_pkgs() {
  local dir="$1" ver="$2" stamp="$3" ldflags="$4"; shift 4
  local out="$dir/out" pkgs=() names=() pair
  for pair in "$@"; do names+=("${pair%%=*}"); pkgs+=("${pair#*=}"); done
  mkdir -p "$out"
  (
    cd "$dir"
    # Resolve every dependency of the wanted packages into go.mod/go.sum
    # (@ver pins the main module; a bare package path would mean @upgrade).
    local t0=$SECONDS c0 c1
    cpu c0
    go get "${pkgs[@]/%/@$ver}"
    cpu c1
    log "  modules resolved in $((SECONDS - t0))s ($((c1 - c0)) CPU-s)"
    go build -p "$JOBS" -ldflags="-s -w $ldflags" -o "$out/" "${pkgs[@]}"
  )
  for n in "${names[@]}"; do
    # go build -o dir/ names binaries after the last import path element.
    mv -f "$out/$n" "$BIN/$n"
    echo "$stamp" >"$BIN/.$n.version"
  done
}

# --- Kubernetes ------------------------------------------------------------
k8s_names=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
need=()
for n in "${k8s_names[@]}"; do up_to_date "$n" "$K8S_VERSION" || need+=("$n"); done
if ((${#need[@]})); then
  t=$SECONDS; cpu c
  log "building ${need[*]} $K8S_VERSION (cold build: ~10-20 min on 2 cores)"
  dir="$(gomodule kubernetes k8s.io/kubernetes "$K8S_VERSION" "v0.${K8S_VERSION#v1.}")"
  ld=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$K8S_MINOR"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  pairs=()
  for n in "${need[@]}"; do pairs+=("$n=k8s.io/kubernetes/cmd/$n"); done
  build_pkgs "$dir" "$K8S_VERSION" "$K8S_VERSION" "$ld" "${pairs[@]}"
  cpu c1
  log "kubernetes binaries done in $((SECONDS - t))s ($((c1 - c)) CPU-s)"
else
  log "kubernetes $K8S_VERSION binaries up to date"
fi

# --- etcd ------------------------------------------------------------------
if ! up_to_date etcd "$ETCD_VERSION"; then
  t=$SECONDS; cpu c
  log "building etcd $ETCD_VERSION"
  dir="$(gomodule etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$ETCD_VERSION")"
  # go build -o dir/ names the binary "server" (major-version suffix dropped).
  build_pkgs "$dir" "$ETCD_VERSION" "$ETCD_VERSION" "" "server=go.etcd.io/etcd/server/v3"
  mv -f "$BIN/server" "$BIN/etcd" && mv -f "$BIN/.server.version" "$BIN/.etcd.version"
  cpu c1
  log "etcd done in $((SECONDS - t))s ($((c1 - c)) CPU-s)"
else
  log "etcd $ETCD_VERSION up to date"
fi

# --- helm ------------------------------------------------------------------
# The ldflags of helm's own Makefile: without them `helm version` is empty and
# `helm template` (no cluster to ask) assumes Kubernetes v1.20, so a chart with
# `kubeVersion: >=1.26` fails.  We bake in the Kubernetes we test against.
helm_stamp="$HELM_VERSION k8s-1.$K8S_MINOR"
if ! up_to_date helm "$helm_stamp"; then
  t=$SECONDS; cpu c
  log "building helm $HELM_VERSION (default Kubernetes v1.$K8S_MINOR)"
  dir="$(gomodule helm helm.sh/helm/v3 "$HELM_VERSION" "")"
  ld="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$K8S_MINOR"
  done
  build_pkgs "$dir" "$HELM_VERSION" "$helm_stamp" "$ld" "helm=helm.sh/helm/v3/cmd/helm"
  cpu c1
  log "helm done in $((SECONDS - t))s ($((c1 - c)) CPU-s)"
else
  log "helm $helm_stamp up to date"
fi

# --- coredns -----------------------------------------------------------------
# Only the plugins the dev cluster's Corefile uses (tests/k8s/clusterdns.py),
# in CoreDNS's own execution order (its plugin.cfg): the full set pulls in
# every cloud SDK and builds several times slower.  A main package of our own
# sets the list with dnsserver.SetDirectives instead of `go generate` in a
# checkout.  The stamp names the plugins, so changing the list rebuilds.
coredns_plugins=(bind ready health errors log cache kubernetes loop forward)
coredns_stamp="$COREDNS_VERSION ${coredns_plugins[*]}"
if ! up_to_date coredns "$coredns_stamp"; then
  t=$SECONDS; cpu c
  log "building coredns $COREDNS_VERSION (plugins: ${coredns_plugins[*]})"
  dir="$(gomodule coredns github.com/coredns/coredns "$COREDNS_VERSION" "")"
  imports="" names=""
  for p in "${coredns_plugins[@]}"; do
    imports+="	_ \"github.com/coredns/coredns/plugin/$p\""$'\n'
    names+="\"$p\", "
  done
  cat >"$dir/main.go" <<EOF
package main

import (
	"fmt"
	"os"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
$imports)

func main() {
	if err := dnsserver.SetDirectives([]string{$names}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	coremain.Run()
}
EOF
  (
    cd "$dir"
    t0=$SECONDS; cpu c0
    go mod tidy
    cpu c1
    log "  modules resolved in $((SECONDS - t0))s ($((c1 - c0)) CPU-s)"
    go build -p "$JOBS" -ldflags="-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
      -o "$BIN/coredns" .
  )
  echo "$coredns_stamp" >"$BIN/.coredns.version"
  cpu c1
  log "coredns done in $((SECONDS - t))s ($((c1 - c)) CPU-s)"
else
  log "coredns $coredns_stamp up to date"
fi

# --- test images: pause (pod sandbox) and echo --------------------------------
# Static Go binaries on an empty image, written as `docker save` archives
# that the harness imports into each node's containerd (k8s.io namespace).
mkdir -p "$IMAGES"
for img in pause:3.10 echo:v1; do
  name="${img%%:*}"
  src="$ROOT/tests/k8s/images/$name/main.go"
  stamp="$(cat "$src" "$ROOT/tests/k8s/ociimage.py" | sha256sum | cut -c1-16) $(go env GOVERSION)"
  if [[ -f "$IMAGES/$name.tar" && "$(cat "$IMAGES/.$name.version" 2>/dev/null)" == "$stamp" ]]; then
    log "image localhost/sluice/$img up to date"
    continue
  fi
  go build -ldflags="-s -w" -o "$IMAGES/$name" "$src"
  python3 "$ROOT/tests/k8s/ociimage.py" --tag "localhost/sluice/$img" --entrypoint "/$name" \
    --add "$name=$IMAGES/$name" --out "$IMAGES/$name.tar" >/dev/null
  echo "$stamp" >"$IMAGES/.$name.version"
  log "image localhost/sluice/$img built ($IMAGES/$name.tar)"
done

cpu c1
log "all tools ready in $BIN ($((SECONDS - t_all))s total, $c1 CPU-s)"
