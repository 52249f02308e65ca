#!/usr/bin/env bash
# must_show_dp.sh: issue 18's DP must-show, end to end through the CLI:
# DP-FedAvg of logistic regression (bench/fed/logreg.json) over N IID cleaved
# client daemons (CURVE keys, allow-list) on the full Fashion-MNIST training
# set, --dp-clip 0.3, --dp-noise-multiplier Z, --dp-delta 1e-5; the JSON
# reports epsilon after every round (rounds[i].epsilon) and at the end.
# Usage: bench/fed/must_show_dp.sh BUILD_DIR OUT_JSON [NOISE (default 1)] [CLIENTS (default 16)] [ROUNDS (default 5)]
set -euo pipefail
build=${1:?build directory}
out=${2:?output JSON}
noise=${3:-1}
clients=${4:-16}
rounds=${5:-5}
src=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d /tmp/cleave-dp-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
mkdir -p "$dir/allow"
"$build/apps/cleave/cleave" keygen --out "$dir" --name coordinator >/dev/null
for ((i = 0; i < clients; i++)); do
  "$build/apps/cleave/cleave" keygen --out "$dir" --name "client$i" >/dev/null
  cp "$dir/client$i.pub" "$dir/allow/"
done
port=$((20000 + RANDOM % 20000))
for ((i = 0; i < clients; i++)); do
  "$build/apps/cleaved/cleaved" --coordinator "tcp://127.0.0.1:$port" --key "$dir/client$i.key" \
    --coordinator-key "$dir/coordinator.pub" --backend cpu --threads 1 --max-jobs 1 \
    --dataset fashion-mnist --shard "$i/$clients" --partition iid --seed 1 >"$dir/client$i.log" 2>&1 &
done
"$build/apps/cleave/cleave" fed --model "$src/bench/fed/logreg.json" --clients "$clients" --rounds "$rounds" \
  --local-epochs 1 --strategy fedavg --optimizer adam --lr 0.001 --batch 64 --seed 1 \
  --dp-clip 0.3 --dp-noise-multiplier "$noise" --dp-delta 1e-5 \
  --key "$dir/coordinator.key" --allow "$dir/allow" --listen "tcp://127.0.0.1:$port" \
  --json "$out" --no-progress
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{'round':<6} {'epsilon':<10} {'accuracy':<9}")
for rd in r["rounds"]:
    print(f"{rd['round']:<6} {rd['epsilon']:<10.4f} {rd['accuracy']:<9.4f}")
print(f"final: epsilon {r['epsilon']:.4f} at delta {r['dp_delta']}, test accuracy {r['test_accuracy']:.4f}")
PY
