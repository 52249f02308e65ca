#!/usr/bin/env python3
"""torch_fedavg.py: the PyTorch reference for issue 7's FedAvg must-show.

The same federation as bench/fed/must_show_fed.sh in plain PyTorch, in one
process: the model a cleave model file describes (PyTorch's default
initialisation), the Fashion-MNIST training set cut into N IID shards (a
seeded permutation cut into near-equal runs), R rounds in which every client
starts from the global weights, trains E local epochs with a fresh Adam
(lr, batch B, shuffled), and the coordinator averages the blocks weighted by
samples and evaluates on the full test set. Prints one JSON object.

  torch_fedavg.py --model models/cnn.json --clients 4 --rounds 3 --local-epochs 1 --seed 1 --threads 2
"""
import argparse
import copy
import json
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "core"))
from torch_fashion_mnist import load_split  # noqa: E402
from torch_train_step import build_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dataset-dir", default=os.environ.get("CLEAVE_DATA_DIR", "/usr/share/datasets/fashion-mnist"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    d = a.dataset_dir
    model, in_shape, _ = build_model(a.model)
    xtr, ytr, xte, yte = load_split(d, in_shape)
    perm = torch.randperm(xtr.shape[0])
    shards = list(torch.tensor_split(perm, a.clients))
    t0 = time.time()
    rounds = []
    for r in range(a.rounds):
        global_state = copy.deepcopy(model.state_dict())
        states, sizes = [], []
        for shard in shards:
            model.load_state_dict(global_state)
            opt = torch.optim.Adam(model.parameters(), lr=a.lr)
            model.train()
            for _ in range(a.local_epochs):
                order = shard[torch.randperm(shard.shape[0])]
                for i in range(0, order.shape[0], a.batch):
                    idx = order[i:i + a.batch]
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
                    opt.step()
            states.append(copy.deepcopy(model.state_dict()))
            sizes.append(shard.shape[0])
        total = float(sum(sizes))
        model.load_state_dict({k: sum(s[k] * (n / total) for s, n in zip(states, sizes)) for k in global_state})
        model.eval()
        with torch.no_grad():
            acc = float((model(xte).argmax(1) == yte).float().mean())
        rounds.append({"round": r + 1, "accuracy": acc})
    print(json.dumps({"model": a.model, "clients": a.clients, "rounds": rounds, "test_accuracy": rounds[-1]["accuracy"],
                      "seed": a.seed, "torch": torch.__version__, "wall_seconds": time.time() - t0}))


if __name__ == "__main__":
    main()
