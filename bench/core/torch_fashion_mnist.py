#!/usr/bin/env python3
"""torch_fashion_mnist.py: the PyTorch reference for issue 2's accuracy bars.

Trains the nn.Sequential a cleave model file describes (built by
torch_train_step.build_model, PyTorch's default initialisation) on the full
Fashion-MNIST from Debian's dataset-fashion-mnist, with exactly the recipe of
`cleave train --local`: pixels / 255, a fresh shuffle every epoch, batches of
B (the last one smaller), mean cross-entropy, Adam, and prints one JSON object
with the test accuracy after each epoch.

  torch_fashion_mnist.py --model models/cnn.json --epochs 3 --batch 64 --lr 0.001 --seed 1 --threads 2
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train_step import build_model  # noqa: E402


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(directory, stem):
    for name in (stem, stem + ".gz"):
        p = os.path.join(directory, name)
        if os.path.exists(p):
            return p
    raise SystemExit(f"{stem} not found in {directory}: apt-get install dataset-fashion-mnist")


def load_split(directory, in_shape):
    """Fashion-MNIST train and test: images scaled to [0, 1] in `in_shape` per sample, labels as int64."""
    def images(stem):
        return (torch.tensor(read_idx(find(directory, stem)), dtype=torch.float32) / 255).reshape([-1] + in_shape)

    def labels(stem):
        return torch.tensor(read_idx(find(directory, stem)), dtype=torch.long)

    return (images("train-images-idx3-ubyte"), labels("train-labels-idx1-ubyte"),
            images("t10k-images-idx3-ubyte"), labels("t10k-labels-idx1-ubyte"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--epochs", type=int, default=3)
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
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    t0 = time.time()
    accs, epoch_losses = [], []
    n = xtr.shape[0]
    for _ in range(a.epochs):
        model.train()
        perm = torch.randperm(n)
        total = 0.0
        for i in range(0, n, a.batch):
            idx = perm[i:i + a.batch]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            total += loss.item() * idx.shape[0]
        epoch_losses.append(total / n)
        model.eval()
        with torch.no_grad():
            accs.append(float((model(xte).argmax(1) == yte).float().mean()))
    print(json.dumps({"model": a.model, "seed": a.seed, "epochs": a.epochs, "batch": a.batch, "lr": a.lr,
                      "torch": torch.__version__, "epoch_test_accuracy": accs, "epoch_train_loss": epoch_losses, "test_accuracy": accs[-1],
                      "wall_seconds": time.time() - t0}))


if __name__ == "__main__":
    main()
