#!/bin/sh
# installed_package.sh BUILD_DIR SCRATCH FED_STATE_DIFF SPLIT_RESULT_DIFF: the
# SDK's must-show (issue 14), out of tree against the installed package.
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
#   4. The installed C++ example share/cleave/examples/split_client.cpp, built
#      through find_package (step 2's build) and through `pkg-config` with
#      c++, joins a `cleave split` run (installed binaries) as the second
#      client beside a `cleaved` server and a `cleaved` client on shard 0/2;
#      each run completes and its training losses, test samples and test
#      accuracy equal those of the run with two `cleaved` clients
#      (SPLIT_RESULT_DIFF; a split run keeps the clients' weights on the
#      clients, so its result is what is compared).
# Exit 77 (CTest: skipped) without Fashion-MNIST, a C compiler or pkg-config.
set -eu
BUILD=$1
SCRATCH=$2
DIFF=$3
SPLIT_DIFF=$4

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
command -v c++ >/dev/null 2>&1 || skip "no C++ compiler (c++)"

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
# shellcheck disable=SC2046
c++ -std=c++17 -Wall -Wextra -pedantic -Werror -o "$SCRATCH/split_client_pc" "$EX/split_client.cpp" \
  $(pkg-config --cflags --libs cleave) -lz -Wl,-rpath,"$LIBDIR" || fail "pkg-config build of split_client"
# The shared builds (and the installed cleaved) load the installed libcleave.so.0, not the build tree's.
for exe in "$SCRATCH/ex-cmake/fed_client" "$SCRATCH/fed_client_pc" "$SCRATCH/ex-cmake/split_client" \
  "$SCRATCH/split_client_pc" "$P/bin/cleaved"; do
  lib=$(ldd "$exe" | sed -n 's/.*libcleave.so.0 => \([^ ]*\).*/\1/p')
  [ "$(readlink -f "$lib")" = "$(readlink -f "$LIBDIR/libcleave.so.0")" ] || fail "$exe loads '$lib', not $LIBDIR/libcleave.so.0"
done

# --- cleaved as a service: the unit starts the installed cleaved with /etc/cleave/cleaved.conf,
# hardened; the example configuration has only keys cleaved knows (it fails on its key file).
UNIT=$P/lib/systemd/system/cleaved.service
[ -f "$UNIT" ] || fail "no $UNIT"
grep -q "^ExecStart=$P/bin/cleaved --config /etc/cleave/cleaved.conf\$" "$UNIT" || { cat "$UNIT"; fail "ExecStart"; }
for d in DynamicUser=yes StateDirectory=cleave ProtectSystem=strict NoNewPrivileges=yes PrivateTmp=yes \
  Restart=on-failure; do
  grep -q "^$d\$" "$UNIT" || fail "the unit lacks $d"
done
if command -v systemd-analyze >/dev/null 2>&1; then
  systemd-analyze verify "$UNIT" 2>&1 | grep -v "not executable\|/etc/cleave" | grep -i "error" && fail "systemd-analyze verify"
fi
code=0
"$P/bin/cleaved" --config "$P/share/cleave/cleaved.conf.example" --check-config >"$SCRATCH/conf.log" 2>&1 || code=$?
[ $code = 1 ] && grep -q "cleaved.conf.example:[0-9]*: key: /var/lib/cleave/board1.key" "$SCRATCH/conf.log" ||
  { cat "$SCRATCH/conf.log"; fail "the example configuration (exit $code)"; }
echo "service: the unit and the example configuration are installed and consistent"

# --- Keys: the coordinator and two devices, their public keys allowed.
K=$SCRATCH/keys
for n in coordinator dev1 dev2 dev3; do "$P/bin/cleave" keygen --out "$K" --name $n >/dev/null; done
mkdir -p "$K/allow"
cp "$K/dev1.pub" "$K/dev2.pub" "$K/dev3.pub" "$K/allow/"

# --- The installed GPU backend modules are found beside the installed libcleave.so, wherever
# the app lives (ex-cmake/ is outside the prefix): the example opens an OpenCL device (PoCL
# here) and measures it, dialling a port where nobody listens.
if [ -f "$LIBDIR/cleave/libcleave-backend-opencl.so" ] && [ -z "${CLEAVE_BACKEND_DIR:-}" ]; then
  "$SCRATCH/ex-cmake/fed_client" --coordinator tcp://127.0.0.1:9 --key "$K/dev1.key" \
    --coordinator-key "$K/coordinator.pub" --shard 0/2 --limit 100 --data "$DATA" --backend opencl \
    >"$SCRATCH/opencl.log" 2>&1 &
  probe=$!
  for _ in $(seq 600); do
    grep -q "GFLOP/s measured" "$SCRATCH/opencl.log" && break
    kill -0 $probe 2>/dev/null || break
    sleep 0.1
  done
  mapped=$(grep -c "$(readlink -f "$LIBDIR")/cleave/libcleave-backend-opencl.so" "/proc/$probe/maps" 2>/dev/null || true)
  kill $probe 2>/dev/null || true
  wait $probe 2>/dev/null || true
  grep -q "GFLOP/s measured" "$SCRATCH/opencl.log" && [ "${mapped:-0}" -gt 0 ] ||
    { cat "$SCRATCH/opencl.log"; fail "the installed OpenCL module was not loaded from beside the installed libcleave.so"; }
  echo "backend modules: the OpenCL module was loaded from beside the installed libcleave.so"
fi

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
echo "the installed fed_client (find_package, pkg-config, static) matches two cleaved clients"

# listen_endpoint LOG TAG: the endpoint a coordinator logged it listens on (waits up to 30 s).
listen_endpoint() {
  for _ in $(seq 300); do
    ep=$(sed -n 's/.*listening on \([^,]*\),.*/\1/p' "$1" | head -n 1)
    [ -n "$ep" ] && { echo "$ep"; return 0; }
    sleep 0.1
  done
  cat "$1" >&2
  fail "$2: the coordinator did not listen"
}

# split_run TAG CLIENT3...: a `cleave split` run with a cleaved server dev1, a
# cleaved client dev2 on shard 0/2 and CLIENT3 (a command line) as dev3;
# fails unless all four exit 0.
split_run() {
  tag=$1
  shift
  log=$SCRATCH/split-$tag
  timeout 120 "$P/bin/cleave" split --model "$P/share/cleave/models/mlp.json" --clients 2 --server dev1 --epochs 1 \
    --batch 64 --seed 3 --optimizer adam --lr 1e-3 --limit-test 200 --threads 1 --key "$K/coordinator.key" \
    --allow "$K/allow" --listen 'tcp://127.0.0.1:*' --register-timeout 60000 --json "$log.json" \
    --shutdown-daemons >"$log.split.log" 2>&1 &
  split=$!
  PIDS="$PIDS $split"
  endpoint=$(listen_endpoint "$log.split.log" "split $tag") || fail "split $tag: the coordinator did not listen"
  daemon() {  # NAME FLAGS...: an installed cleaved of the run
    name=$1
    shift
    timeout 120 "$P/bin/cleaved" --coordinator "$endpoint" --key "$K/$name.key" --coordinator-key \
      "$K/coordinator.pub" --name "$name" --backend cpu --threads 1 --max-jobs 1 "$@" >"$log.$name.log" 2>&1 &
    PIDS="$PIDS $!"
  }
  daemon dev1
  dev1=$!
  daemon dev2 --dataset fashion-mnist --shard 0/2 --seed 11 --limit-train 640
  dev2=$!
  code=0
  "$@" --coordinator "$endpoint" >"$log.dev3.log" 2>&1 || code=$?
  codes=
  for p in $split $dev1 $dev2; do
    c=0
    wait "$p" || c=$?
    codes="$codes $c"
  done
  if [ "$code$codes" != "0 0 0 0" ]; then
    tail -n 30 "$log.split.log" "$log.dev1.log" "$log.dev2.log" "$log.dev3.log"
    fail "split $tag: dev3, coordinator, dev1, dev2 exited $code$codes"
  fi
  echo "split $tag: the run completed"
}

split_run reference timeout 120 "$P/bin/cleaved" --key "$K/dev3.key" --coordinator-key "$K/coordinator.pub" \
  --name dev3 --backend cpu --threads 1 --max-jobs 1 --dataset fashion-mnist --shard 1/2 --seed 11 --limit-train 640

for build in cmake:"$SCRATCH/ex-cmake/split_client" pkg-config:"$SCRATCH/split_client_pc"; do
  tag=${build%%:*}
  exe=${build#*:}
  split_run "$tag" timeout 120 "$exe" --key "$K/dev3.key" --coordinator-key "$K/coordinator.pub" --shard 1/2 \
    --seed 11 --limit 640 --limit-test 200 --data "$DATA" --backend cpu --threads 1
  grep -q "shard 1/2 (iid): 320 samples, 100 test samples" "$SCRATCH/split-$tag.dev3.log" ||
    { cat "$SCRATCH/split-$tag.dev3.log"; fail "split $tag: shard"; }
  grep -q "progress: job ended" "$SCRATCH/split-$tag.dev3.log" ||
    { cat "$SCRATCH/split-$tag.dev3.log"; fail "split $tag: no progress"; }
  "$SPLIT_DIFF" "$SCRATCH/split-reference.json" "$SCRATCH/split-$tag.json" 1e-6 ||
    fail "split $tag: the result differs from two cleaved clients"
done
echo "PASS: the installed fed_client (find_package, pkg-config, static) and split_client (find_package, pkg-config) match runs of cleaved clients"
