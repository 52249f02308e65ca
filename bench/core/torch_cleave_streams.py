#!/usr/bin/env python3
"""torch_cleave_streams.py: PyTorch trained from cleave's random streams.

Separates "cleave computes differently" from "cleave draws different random
numbers": PyTorch trains the model of a cleave model file starting from the
weights cleave initialised (exported with `cleave export`) and visiting the
training set in cleave's batch order (the seeded Fisher-Yates of
core/data/loader.cpp over xoshiro256** / splitmix64 from core/util/rng.h,
re-implemented here bit for bit), with the recipe of `cleave train --local`
(Adam, mean cross-entropy, pixels / 255). Its first steps reproduce cleave's
losses to float rounding; over a whole run the two then differ only by
arithmetic.

  cleave train --local --model models/cnn.json --dataset fashion-mnist --epochs 1 --max-steps 0 \\
      --limit-train 64 --seed 3 --save init3.ck
  cleave export --checkpoint init3.ck --out init3.safetensors
  torch_cleave_streams.py --model models/cnn.json --init init3.safetensors --seed 3 --epochs 3
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_fashion_mnist import load_split  # noqa: E402
from torch_train_step import build_model  # noqa: E402

MASK = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return x, z ^ (z >> 31)


def derive_seed(seed, a, b=0, c=0):
    x, h = splitmix64(seed ^ 0x6A09E667F3BCC909)
    for key in (a, b, c):
        x, h = splitmix64(h ^ key)
    return h


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & MASK


class Rng:  # xoshiro256**, seeded by splitmix64 (core/util/rng.h)
    def __init__(self, seed):
        self.s, x = [], seed
        for _ in range(4):
            x, v = splitmix64(x)
            self.s.append(v)

    def next_u64(self):
        s = self.s
        result = (rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result


def seeded_permutation(n, seed):  # core/data/loader.cpp
    order, rng = list(range(n)), Rng(seed)
    for i in range(n - 1, 0, -1):
        j = rng.next_u64() % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--init", required=True, help="safetensors exported by `cleave export` from cleave's initial weights")
    ap.add_argument("--seed", type=int, required=True, help="the cleave run's --seed (its batch order)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dataset-dir", default=os.environ.get("CLEAVE_DATA_DIR", "/usr/share/datasets/fashion-mnist"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d = a.dataset_dir
    model, in_shape, _ = build_model(a.model)
    xtr, ytr, xte, yte = load_split(d, in_shape)
    model.load_state_dict(load_file(a.init))
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    n, t0, losses, accs, epoch_losses = xtr.shape[0], time.time(), [], [], []
    for epoch in range(a.epochs):
        order = torch.tensor(seeded_permutation(n, derive_seed(a.seed, epoch)))
        model.train()
        for i in range(0, n, a.batch):
            idx = order[i:i + a.batch]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        epoch_losses.append(sum(losses[-((n + a.batch - 1) // a.batch):]) / ((n + a.batch - 1) // a.batch))
        model.eval()
        with torch.no_grad():
            accs.append(float((model(xte).argmax(1) == yte).float().mean()))
    print(json.dumps({"model": a.model, "seed": a.seed, "init": a.init, "epoch_test_accuracy": accs,
                      "epoch_train_loss": epoch_losses, "test_accuracy": accs[-1], "losses": losses,
                      "wall_seconds": time.time() - t0}))


if __name__ == "__main__":
    main()
