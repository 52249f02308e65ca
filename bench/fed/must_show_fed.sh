#!/usr/bin/env bash
# must_show_fed.sh: issue 7's accuracy must-show, end to end through the CLI:
# FedAvg of the CNN over 4 IID cleaved client daemons (CURVE keys, allow-list),
# 3 rounds of 1 local epoch, Adam lr 0.001, batch 64, full Fashion-MNIST.
# Usage: bench/fed/must_show_fed.sh BUILD_DIR OUT_JSON [SEED (default 1)]   (takes minutes on 2 cores)
set -euo pipefail
build=${1:?build directory}
out=${2:?output JSON}
seed=${3:-1}
src=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d /tmp/cleave-fed-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
mkdir -p "$dir/allow"
"$build/apps/cleave/cleave" keygen --out "$dir" --name coordinator >/dev/null
for i in 0 1 2 3; do
  "$build/apps/cleave/cleave" keygen --out "$dir" --name "client$i" >/dev/null
  cp "$dir/client$i.pub" "$dir/allow/"
done
port=$((20000 + RANDOM % 20000))
for i in 0 1 2 3; do
  "$build/apps/cleaved/cleaved" --coordinator "tcp://127.0.0.1:$port" --key "$dir/client$i.key" \
    --coordinator-key "$dir/coordinator.pub" --backend cpu --threads 1 --max-jobs 1 \
    --dataset fashion-mnist --shard "$i/4" --partition iid --seed "$seed" >"$dir/client$i.log" 2>&1 &
done
"$build/apps/cleave/cleave" fed --model "$src/models/cnn.json" --clients 4 --rounds 3 --local-epochs 1 \
  --strategy fedavg --optimizer adam --lr 0.001 --batch 64 --seed "$seed" \
  --key "$dir/coordinator.key" --allow "$dir/allow" --listen "tcp://127.0.0.1:$port" \
  --json "$out" --no-progress
