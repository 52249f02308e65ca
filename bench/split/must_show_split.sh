#!/usr/bin/env bash
# must_show_split.sh: issue 7's split-learning accuracy must-show, end to end
# through the CLI on full Fashion-MNIST: the CNN trained 3 epochs (Adam lr
# 0.001, batch 64, seed 1) by local training, by vanilla split learning (labels
# on the server) and by U-shaped split learning with SplitFed averaging
# (labels on the clients), each split run over a server daemon and 2 client
# daemons holding IID halves of the training set (CURVE keys, allow-list).
# Prints the three test accuracies and the gaps to local training.
# Usage: bench/split/must_show_split.sh BUILD_DIR OUT_DIR   (takes ~10 minutes on 2 cores)
set -euo pipefail
build=${1:?build directory}
out=${2:?output directory}
src=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
dir=$(mktemp -d /tmp/cleave-split-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
cleave="$build/apps/cleave/cleave"
common=(--model "$src/models/cnn.json" --epochs 3 --batch 64 --optimizer adam --lr 0.001 --seed 1 --no-progress)

"$cleave" train --local --dataset fashion-mnist "${common[@]}" --json "$out/local.json" >/dev/null

mkdir -p "$dir/allow"
"$cleave" keygen --out "$dir" --name coordinator >/dev/null
for n in server client0 client1; do
  "$cleave" keygen --out "$dir" --name "$n" >/dev/null
  cp "$dir/$n.pub" "$dir/allow/"
done
run_split() {  # run_split NAME FLAGS...
  local name=$1; shift
  local port=$((20000 + RANDOM % 20000))
  local daemon=("$build/apps/cleaved/cleaved" --coordinator "tcp://127.0.0.1:$port" --coordinator-key "$dir/coordinator.pub"
                --backend cpu --threads 1 --max-jobs 1)
  "${daemon[@]}" --key "$dir/server.key" >"$dir/server-$name.log" 2>&1 &
  for i in 0 1; do
    "${daemon[@]}" --key "$dir/client$i.key" --dataset fashion-mnist --shard "$i/2" --partition iid --seed 1 \
      >"$dir/client$i-$name.log" 2>&1 &
  done
  "$cleave" split "${common[@]}" --clients 2 "$@" --key "$dir/coordinator.key" --allow "$dir/allow" \
    --listen "tcp://127.0.0.1:$port" --json "$out/$name.json" >/dev/null
  wait
}
run_split split-vanilla --labels server
run_split split-ushaped-splitfed --labels client --splitfed

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
local = json.load(open(f"{out}/local.json"))["test_accuracy"]
print(f"{'run':28} {'test_accuracy':>13} {'vs local':>9}")
print(f"{'local':28} {local:13.4f} {'':>9}")
for name in ("split-vanilla", "split-ushaped-splitfed"):
    acc = json.load(open(f"{out}/{name}.json"))["test_accuracy"]
    print(f"{name:28} {acc:13.4f} {100 * (acc - local):+8.2f}pt")
PY
