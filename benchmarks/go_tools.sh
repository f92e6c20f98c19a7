#!/usr/bin/env bash
# Build the Go side of the comparisons: NSQ v1.3.0's nsqd, bench_writer, bench_reader and nsq_stat, which
# benchmarks/pub_compare.py, compare.py and the README's "against Go nsqd" figures run (--go-bench-writer,
# --server go=..., --target go=...). They are measurement baselines only; nothing in nsqpy needs them.
#
#   bash benchmarks/go_tools.sh BIN_DIR                      # from github.com and the Go module proxy
#   MIRRORS=DIR bash benchmarks/go_tools.sh BIN_DIR          # offline, from bare git mirrors (below)
#
# Needs Go >= 1.17 (Debian bookworm: apt-get install golang-go, go1.19). Everything the build writes (module
# cache, build cache, sources) goes under BIN_DIR/.build; BIN_DIR gets the four binaries.
#
# Offline, MIRRORS holds one bare mirror per repository as <owner>+<name>/repo (the layout this workplace's fetch
# tool writes): nsqio/nsq and each module NSQ v1.3.0's go.mod requires (MODULES below, at go.mod's versions).
# Each module is unpacked at that version and its go.mod requirement replaced by the directory, in a copy of
# NSQ's go.mod; the checkout itself is not modified.
set -euo pipefail

BIN=${1:?usage: go_tools.sh BIN_DIR}
mkdir -p "$BIN"
BIN=$(cd "$BIN" && pwd)
WORK=$BIN/.build
NSQ_TAG=v1.3.0
NSQ_COMMIT=f580340fd5be61a94d0fef388458f027925c7fc0
PACKAGES="./apps/nsqd ./bench/bench_writer ./bench/bench_reader ./apps/nsq_stat"

# module path, mirror name, revision (the tag or commit go.mod's version names)
MODULES=(
  "github.com/BurntSushi/toml          BurntSushi+toml           v1.3.2"
  "github.com/bitly/go-hostpool        bitly+go-hostpool         v0.1.0"
  "github.com/bitly/timer_metrics      bitly+timer_metrics       v1.0.0"
  "github.com/blang/semver             blang+semver              v3.5.1"
  "github.com/bmizerany/perks          bmizerany+perks           d9a9656a3a4b1c2864fdb44db2ef8619772d92aa"
  "github.com/golang/snappy            golang+snappy             v0.0.4"
  "github.com/judwhite/go-svc          mreiferson+go-svc         7a96e00010f68d9436e3de53a70c53f209a0c244"
  "github.com/julienschmidt/httprouter julienschmidt+httprouter  v1.3.0"
  "github.com/mreiferson/go-options    mreiferson+go-options     v1.0.0"
  "github.com/nsqio/go-diskqueue       nsqio+go-diskqueue        v1.1.0"
  "github.com/nsqio/go-nsq             nsqio+go-nsq              v1.1.0"
  "golang.org/x/sys                    golang+sys                v0.10.0"
)

export GOPATH=$WORK/gopath GOMODCACHE=$WORK/gopath/pkg/mod GOCACHE=$WORK/gocache CGO_ENABLED=0
go version

SRC=$WORK/nsq
if [ -n "${MIRRORS:-}" ]; then
  export GOPROXY=off GOSUMDB=off GOFLAGS=-mod=mod
  [ -d "$SRC/.git" ] || git clone -q --no-checkout "$MIRRORS/nsqio+nsq/repo" "$SRC"
else
  [ -d "$SRC/.git" ] || git clone -q --no-checkout https://github.com/nsqio/nsq "$SRC"
fi
git -C "$SRC" -c advice.detachedHead=false checkout -q -f "$NSQ_TAG"
test "$(git -C "$SRC" rev-parse HEAD)" = "$NSQ_COMMIT"

MODFILE=$WORK/go.build.mod
cp "$SRC/go.mod" "$MODFILE"
cp "$SRC/go.sum" "$WORK/go.build.sum"
if [ -n "${MIRRORS:-}" ]; then
  go mod edit -dropreplace=github.com/judwhite/go-svc "$MODFILE"  # replaced below by the same commit, unpacked
  for entry in "${MODULES[@]}"; do
    read -r module mirror revision <<< "$entry"
    dir=$WORK/modules/${module//\//_}
    rm -rf "$dir" && mkdir -p "$dir"
    git --git-dir="$MIRRORS/$mirror/repo" archive "$revision" | tar -x -C "$dir"
    # modules from before Go modules have no go.mod; a directory replacement needs one
    [ -f "$dir/go.mod" ] || printf 'module %s\n' "$module" > "$dir/go.mod"
    go mod edit -replace="$module=$dir" "$MODFILE"
  done
fi

cd "$SRC"
for package in $PACKAGES; do
  go build -modfile="$MODFILE" -trimpath -o "$BIN/$(basename "$package")" "$package"
done
"$BIN/nsqd" --version
ls "$BIN"
