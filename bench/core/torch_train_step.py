#!/usr/bin/env python3
"""torch_train_step.py: PyTorch side of bench_train_step (training-step throughput).

Builds the nn.Sequential that a cleave model JSON file describes (the same layer
types and defaults as core/nn), with synthetic inputs in [0, 1) and random labels
from a fixed seed, and times training steps exactly like cleave's local trainer:
forward, cross-entropy (mean over the batch), backward, Adam step, zero_grad.

Two modes:
  one-shot   torch_train_step.py --model models/mlp.json --batch 128 --threads 2 --steps 50
             prints one JSON object (samples/s of each repetition and their median).
  --serve    reads one JSON request per line on stdin, answers one JSON line per
             request on stdout; bench_train_step keeps one such process so that
             its repetitions alternate with cleave's (fair on a noisy machine).
             Request: {"model": PATH, "batch": B, "threads": T, "steps": N,
                       "warmup": W, "seed": S}
             Answer:  {"ok": true, "seconds": S, "steps": N, "samples_per_sec": X}
                   or {"ok": false, "error": "..."}
             The first line written is a hello: {"ok": true, "torch": VERSION, ...}
             or {"ok": false, "error": "..."} when torch cannot be imported.

Exit status: 0 on success, 2 on bad arguments or a bad model file, 3 when torch
is missing (the JSON printed says so).
"""
import argparse
import json
import statistics
import sys
import time


def fail(msg, code=2):
    print(json.dumps({"ok": False, "error": msg}), flush=True)
    sys.exit(code)


try:
    import torch
    import torch.nn as nn
except Exception as e:  # ImportError, or a broken install
    torch = None
    TORCH_ERROR = f"cannot import torch: {e}"
else:
    TORCH_ERROR = None


def pair(layer, key, default):
    v = layer.get(key, default)
    if isinstance(v, int):
        return (v, v)
    if isinstance(v, list) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return tuple(v)
    raise ValueError(f"field '{key}': expected an integer or a pair of integers, got {v!r}")


def build_model(path):
    """nn.Sequential for a cleave model file, plus the per-sample input shape."""
    with open(path) as f:
        doc = json.load(f)
    shape = list(doc["input"])  # per sample
    if doc.get("loss", "cross_entropy") != "cross_entropy":
        raise ValueError(f"{path}: only cross_entropy models are benchmarked")
    mods = []
    for i, layer in enumerate(doc["layers"]):
        t = layer.get("type")
        try:
            if t == "linear":
                if len(shape) != 1:
                    raise ValueError(f"linear needs a rank-1 input, got {shape}")
                out = layer["out_features"]
                mods.append(nn.Linear(shape[0], out, bias=layer.get("bias", True)))
                shape = [out]
            elif t == "conv2d":
                k, s, p = pair(layer, "kernel", None), pair(layer, "stride", 1), pair(layer, "padding", 0)
                oc = layer["out_channels"]
                mods.append(nn.Conv2d(shape[0], oc, k, stride=s, padding=p, bias=layer.get("bias", True)))
                shape = [oc, (shape[1] + 2 * p[0] - k[0]) // s[0] + 1, (shape[2] + 2 * p[1] - k[1]) // s[1] + 1]
            elif t in ("maxpool2d", "avgpool2d"):
                k = pair(layer, "kernel", None)
                s, p = pair(layer, "stride", list(k)), pair(layer, "padding", 0)
                cls = nn.MaxPool2d if t == "maxpool2d" else nn.AvgPool2d
                mods.append(cls(k, stride=s, padding=p))
                shape = [shape[0], (shape[1] + 2 * p[0] - k[0]) // s[0] + 1, (shape[2] + 2 * p[1] - k[1]) // s[1] + 1]
            elif t == "flatten":
                mods.append(nn.Flatten())
                n = 1
                for d in shape:
                    n *= d
                shape = [n]
            elif t == "relu":
                mods.append(nn.ReLU())
            elif t == "gelu":
                mods.append(nn.GELU())
            elif t == "tanh":
                mods.append(nn.Tanh())
            elif t == "dropout":
                mods.append(nn.Dropout(layer.get("p", 0.5)))
            elif t == "layernorm":
                mods.append(nn.LayerNorm(shape[-1], eps=layer.get("eps", 1e-5)))
            else:
                raise ValueError(f"unknown layer type {t!r}")
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"{path}: layer {i} ({t}): {e}") from None
    if len(shape) != 1:
        raise ValueError(f"{path}: the output must be (classes), got {shape}")
    return nn.Sequential(*mods), list(doc["input"]), shape[0]


class Job:
    """A model, its Adam optimizer and a few synthetic batches (cycled)."""

    def __init__(self, model_path, batch, seed):
        torch.manual_seed(seed)
        self.model, in_shape, classes = build_model(model_path)
        self.model.train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.loss_fn = nn.CrossEntropyLoss()
        g = torch.Generator().manual_seed(seed)
        self.xs = [torch.rand([batch] + in_shape, generator=g) for _ in range(4)]
        self.ys = [torch.randint(0, classes, (batch,), generator=g) for _ in range(4)]
        self.batch = batch
        self.i = 0

    def step(self):
        x, y = self.xs[self.i % 4], self.ys[self.i % 4]
        self.i += 1
        out = self.model(x)
        loss = self.loss_fn(out, y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss.item()  # cleave's trainer also brings the loss to the host every step

    def time(self, steps, warmup):
        for _ in range(warmup):
            self.step()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        return time.perf_counter() - t0


def check_int(req, key, lo):
    v = req.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"'{key}' must be an integer >= {lo}, got {v!r}")
    return v


def serve():
    if torch is None:
        fail(TORCH_ERROR, 3)
    print(json.dumps({"ok": True, "torch": torch.__version__, "default_threads": torch.get_num_threads()}),
          flush=True)
    torch.set_num_interop_threads(1)
    jobs = {}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            if not isinstance(req, dict) or not isinstance(req.get("model"), str):
                raise ValueError("request must be an object with a string 'model'")
            batch, threads = check_int(req, "batch", 1), check_int(req, "threads", 1)
            steps, warmup, seed = check_int(req, "steps", 1), check_int(req, "warmup", 0), check_int(req, "seed", 0)
            torch.set_num_threads(threads)
            key = (req["model"], batch, seed)
            if key not in jobs:
                jobs[key] = Job(req["model"], batch, seed)
            secs = jobs[key].time(steps, warmup)
            ans = {"ok": True, "seconds": secs, "steps": steps, "threads": torch.get_num_threads(),
                   "samples_per_sec": steps * batch / secs}
        except Exception as e:  # answer, keep serving
            ans = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(ans), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--serve", action="store_true", help="answer JSON requests on stdin (see the file comment)")
    ap.add_argument("--model", help="cleave model JSON file")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch's default)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per repetition")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.serve:
        serve()
        return
    if torch is None:
        fail(TORCH_ERROR, 3)
    if not a.model:
        fail("--model is required (or --serve)")
    if a.batch < 1 or a.steps < 1 or a.reps < 1 or a.warmup < 0 or a.threads < 0:
        fail("--batch, --steps and --reps must be >= 1; --warmup and --threads >= 0")
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        job = Job(a.model, a.batch, a.seed)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        fail(str(e))
    rates = []
    for r in range(a.reps):
        secs = job.time(a.steps, a.warmup if r == 0 else 0)
        rates.append(a.steps * a.batch / secs)
    print(json.dumps({"ok": True, "torch": torch.__version__, "model": a.model, "batch": a.batch,
                      "threads": torch.get_num_threads(), "steps": a.steps, "reps": a.reps,
                      "samples_per_sec": rates, "median_samples_per_sec": statistics.median(rates)}))


if __name__ == "__main__":
    main()
