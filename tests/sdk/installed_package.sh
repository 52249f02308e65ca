#!/bin/sh
# installed_package.sh BUILD_DIR SCRATCH FED_STATE_DIFF: the SDK's must-show
# (issue 14), out of tree against the installed package.
#
#   1. `cmake --install BUILD_DIR --prefix SCRATCH/prefix`.
#   2. The installed C example share/cleave/examples/fed_client.c is built out
#      of tree three ways: through find_package(cleave) (the installed
#      standalone CMakeLists.txt, -DCMAKE_PREFIX_PATH), through
#      `pkg-config --cflags --libs cleave` (libcleave.so), and against the
#      self-contained libcleave.a (`pkg-config --static`; no libcleave.so needed
#      at run time).
#   3. A reference `cleave fed` run (installed binaries) with two `cleaved`
#      clients on the iid shards 0/2 and 1/2 (--seed 11, first 1200 samples);
#      then, for each built example, the same run with the example as the
#      second client (`--shard 1/2 --seed 11 --limit 1200`: cleaved's iid shard,
#      computed by the example itself). Each run completes (the coordinator and
#      both clients exit 0, the example printed its rounds) and its final global
#      weights equal the reference's (1e-6 relative, FED_STATE_DIFF).
# Exit 77 (CTest: skipped) without Fashion-MNIST, a C compiler or pkg-config.
set -eu
BUILD=$1
SCRATCH=$2
DIFF=$3

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

# Fashion-MNIST where cleaved looks ($CLEAVE_DATA_DIR, its fashion-mnist/, the default).
DATA=
for d in ${CLEAVE_DATA_DIR:+"$CLEAVE_DATA_DIR" "$CLEAVE_DATA_DIR/fashion-mnist"} /usr/share/datasets/fashion-mnist; do
  if [ -e "$d/train-images-idx3-ubyte.gz" ] || [ -e "$d/train-images-idx3-ubyte" ]; then DATA=$d; break; fi
done
[ -n "$DATA" ] || skip "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist or set CLEAVE_DATA_DIR)"
command -v cc >/dev/null 2>&1 || skip "no C compiler (cc)"
command -v pkg-config >/dev/null 2>&1 || skip "no pkg-config"

rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
P=$SCRATCH/prefix
cmake --install "$BUILD" --prefix "$P" >"$SCRATCH/install.log" 2>&1 || { cat "$SCRATCH/install.log"; fail "cmake --install"; }
EX=$P/share/cleave/examples

# --- Build the example three ways, out of tree.
cmake -S "$EX" -B "$SCRATCH/ex-cmake" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release >"$SCRATCH/ex-cmake.log" 2>&1 &&
  cmake --build "$SCRATCH/ex-cmake" >>"$SCRATCH/ex-cmake.log" 2>&1 || { cat "$SCRATCH/ex-cmake.log"; fail "find_package build"; }

export PKG_CONFIG_PATH=$P/lib/pkgconfig
LIBDIR=$(pkg-config --variable=libdir cleave)
WARN="-std=c99 -Wall -Wextra -pedantic -Werror"
# shellcheck disable=SC2046,SC2086  # pkg-config's words are meant to split
cc $WARN -o "$SCRATCH/fed_client_pc" "$EX/fed_client.c" $(pkg-config --cflags --libs cleave) -lz -Wl,-rpath,"$LIBDIR" ||
  fail "pkg-config build"
# The static archive first, then what it needs (Libs.private) without -lcleave.
# shellcheck disable=SC2046,SC2086
cc $WARN -o "$SCRATCH/fed_client_static" "$EX/fed_client.c" $(pkg-config --cflags cleave) "$LIBDIR/libcleave.a" \
  $(pkg-config --static --libs-only-l cleave | sed 's/-lcleave\b//') -lz || fail "static build"
if readelf -d "$SCRATCH/fed_client_static" | grep -q 'libcleave'; then fail "fed_client_static needs libcleave.so"; fi
# The shared builds load the installed libcleave.so.0, not the build tree's.
for exe in "$SCRATCH/ex-cmake/fed_client" "$SCRATCH/fed_client_pc"; do
  lib=$(ldd "$exe" | sed -n 's/.*libcleave.so.0 => \([^ ]*\).*/\1/p')
  [ "$(readlink -f "$lib")" = "$(readlink -f "$LIBDIR/libcleave.so.0")" ] || fail "$exe loads '$lib', not $LIBDIR/libcleave.so.0"
done

# --- Keys: the coordinator and two devices, their public keys allowed.
K=$SCRATCH/keys
for n in coordinator dev1 dev2; do "$P/bin/cleave" keygen --out "$K" --name $n >/dev/null; done
mkdir -p "$K/allow"
cp "$K/dev1.pub" "$K/dev2.pub" "$K/allow/"

PIDS=
cleanup() { for p in $PIDS; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# fed_run TAG CLIENT2...: a `cleave fed` run with cleaved dev1 on shard 0/2 and
# CLIENT2 (a command line) as dev2; fails unless all three exit 0.
fed_run() {
  tag=$1
  shift
  log=$SCRATCH/$tag
  timeout 120 "$P/bin/cleave" fed --model "$P/share/cleave/models/mlp.json" --dataset fashion-mnist --clients 2 \
    --min-clients 2 --rounds 2 --batch 32 --seed 5 --limit-test 500 --threads 1 --key "$K/coordinator.key" \
    --allow "$K/allow" --listen 'tcp://127.0.0.1:*' --register-timeout 60000 --json "$log.json" --save "$log.ckpt" \
    --shutdown-clients >"$log.fed.log" 2>&1 &
  fed=$!
  PIDS="$PIDS $fed"
  endpoint=
  for _ in $(seq 300); do
    endpoint=$(sed -n 's/.*listening on \([^,]*\),.*/\1/p' "$log.fed.log" | head -n 1)
    [ -n "$endpoint" ] && break
    sleep 0.1
  done
  [ -n "$endpoint" ] || { cat "$log.fed.log"; fail "$tag: the coordinator did not listen"; }
  timeout 120 "$P/bin/cleaved" --coordinator "$endpoint" --key "$K/dev1.key" --coordinator-key "$K/coordinator.pub" \
    --name dev1 --backend cpu --threads 1 --max-jobs 1 --dataset fashion-mnist --shard 0/2 --seed 11 \
    --limit-train 1200 >"$log.dev1.log" 2>&1 &
  dev1=$!
  PIDS="$PIDS $dev1"
  code=0
  "$@" --coordinator "$endpoint" >"$log.dev2.log" 2>&1 || code=$?
  fed_code=0
  wait $fed || fed_code=$?
  dev1_code=0
  wait $dev1 || dev1_code=$?
  if [ $code != 0 ] || [ $fed_code != 0 ] || [ $dev1_code != 0 ]; then
    tail -n 30 "$log.fed.log" "$log.dev1.log" "$log.dev2.log"
    fail "$tag: coordinator $fed_code, dev1 $dev1_code, dev2 $code"
  fi
  echo "$tag: the run completed"
}

fed_run reference timeout 120 "$P/bin/cleaved" --key "$K/dev2.key" --coordinator-key "$K/coordinator.pub" --name dev2 \
  --backend cpu --threads 1 --max-jobs 1 --dataset fashion-mnist --shard 1/2 --seed 11 --limit-train 1200

for build in cmake:"$SCRATCH/ex-cmake/fed_client" pkg-config:"$SCRATCH/fed_client_pc" static:"$SCRATCH/fed_client_static"; do
  tag=${build%%:*}
  exe=${build#*:}
  fed_run "$tag" timeout 120 "$exe" --key "$K/dev2.key" --coordinator-key "$K/coordinator.pub" --shard 1/2 --seed 11 \
    --limit 1200 --data "$DATA" --backend cpu --threads 1
  grep -q "shard 1/2 (iid): 600 samples" "$SCRATCH/$tag.dev2.log" || { cat "$SCRATCH/$tag.dev2.log"; fail "$tag: shard"; }
  grep -q "round 2: local loss" "$SCRATCH/$tag.dev2.log" || { cat "$SCRATCH/$tag.dev2.log"; fail "$tag: no progress"; }
  "$DIFF" "$SCRATCH/reference.ckpt" "$SCRATCH/$tag.ckpt" 1e-6 || fail "$tag: weights differ from two cleaved clients"
done
echo "PASS: find_package, pkg-config and static builds of the installed fed_client match two cleaved clients"
