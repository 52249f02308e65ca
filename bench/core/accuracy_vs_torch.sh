#!/usr/bin/env bash
# accuracy_vs_torch.sh: issue 2's accuracy bars over several seeds, cleave and
# PyTorch side by side on this machine: `cleave train --local` with the issue's
# flags (Adam, lr 0.001, batch 64, 3 epochs, full Fashion-MNIST) and the same
# recipe in PyTorch (torch_fashion_mnist.py, default initialisation), for the
# CNN and the MLP. Prints a table (per seed, then mean and spread) and writes
# OUT_DIR/accuracy-vs-torch.json. Takes ~5 minutes per seed on 2 cores.
# Usage: bench/core/accuracy_vs_torch.sh BUILD_DIR OUT_DIR [SEEDS (default "1 2 3 4 5")] [THREADS (default 2)]
set -euo pipefail
build=${1:?build directory}
out=${2:?output directory}
seeds=${3:-1 2 3 4 5}
threads=${4:-2}
src=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
have_torch=1
python3 -c "import torch" 2>/dev/null || { have_torch=0; echo "PyTorch not installed: cleave only" >&2; }
for seed in $seeds; do
  for model in cnn mlp; do
    "$build/apps/cleave/cleave" train --local --model "$src/models/$model.json" --dataset fashion-mnist \
      --epochs 3 --batch 64 --optimizer adam --lr 0.001 --seed "$seed" --threads "$threads" --no-progress \
      --json "$out/cleave-$model-$seed.json" >/dev/null
    if [ "$have_torch" = 1 ]; then
      python3 "$src/bench/core/torch_fashion_mnist.py" --model "$src/models/$model.json" --epochs 3 --batch 64 \
        --lr 0.001 --seed "$seed" --threads "$threads" >"$out/torch-$model-$seed.json"
    fi
  done
done
python3 - "$out" $seeds <<'PY'
import json, os, statistics, sys
out, seeds = sys.argv[1], sys.argv[2:]
bars = {"cnn": 0.895, "mlp": 0.865}
rows, doc = [], {"bars": bars, "runs": []}
for model in ("cnn", "mlp"):
    for who in ("cleave", "torch"):
        accs = []
        for s in seeds:
            p = f"{out}/{who}-{model}-{s}.json"
            if not os.path.exists(p):
                continue
            a = json.load(open(p))["test_accuracy"]
            accs.append(a)
            doc["runs"].append({"model": model, "framework": who, "seed": int(s), "test_accuracy": a})
        if accs:
            rows.append((model, who, accs))
print(f"{'model':6} {'framework':9} " + " ".join(f"{'seed ' + s:>8}" for s in seeds) + f" {'mean':>7} {'sd':>6} {'>= bar':>7}")
for model, who, accs in rows:
    sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
    hits = sum(a >= bars[model] for a in accs)
    print(f"{model:6} {who:9} " + " ".join(f"{a:8.4f}" for a in accs) + f" {statistics.mean(accs):7.4f} {sd:6.4f} {hits:>3}/{len(accs)}")
    doc.setdefault("summary", []).append({"model": model, "framework": who, "mean": statistics.mean(accs), "sd": sd,
                                          "at_or_above_bar": hits, "runs": len(accs), "bar": bars[model]})
json.dump(doc, open(f"{out}/accuracy-vs-torch.json", "w"), indent=2)
PY
