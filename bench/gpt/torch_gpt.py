#!/usr/bin/env python3
"""torch_gpt.py: cleave's byte-level GPTs (models/gpt-*.json) in PyTorch.

Builds the model a cleave GPT model file describes -- embedding,
position_embedding, transformer_block (pre-LN, GELU tanh, causal attention),
layernorm, linear at every position (optionally "tied_to" the embedding) --
with exactly the parameter names and shapes `cleave export` writes ("0.weight",
"2.attn.c_attn.weight", ...; docs/checkpoints.md), so cleave's safetensors load
strictly. Three commands, each printing one JSON object on stdout:

  eval        --model M --weights W.safetensors --text FILE [--limit-test N]
              the validation loss (nats per byte) of cleave's weights on the
              validation windows cleave uses (core/data/text.cpp): the last
              n - floor(0.9 n) bytes of the file, windows at offsets 0, T, 2T, ...
              while a window and its next byte fit, the first N of them.
  train       --model M --text FILE --steps S --batch B [--optimizer adamw ...]
              trains with the same optimizer, schedule and initialisation scheme
              as `cleave train` (N(0, 0.02) matrices and embeddings, zero biases,
              LayerNorm 1/0, PyTorch's default for the top-level linear), random
              training windows, and reports the losses and the validation loss.
  throughput  --model M --batch B --threads T --steps S [--reps R]
              tokens/s of training steps (forward, loss, backward, optimizer
              step) on random bytes, as cleave's trainer runs them.

Exit status: 0 on success, 2 on bad arguments or a bad model file, 3 when torch
is missing (the JSON printed says so: {"ok": false, "error": "cannot import torch: ..."}).
"""
import argparse
import json
import math
import statistics
import struct
import sys
import time


def fail(msg, code=2):
    print(json.dumps({"ok": False, "error": msg}), flush=True)
    sys.exit(code)


try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:  # ImportError, or a broken install
    torch = None
    TORCH_ERROR = f"cannot import torch: {e}"
else:
    TORCH_ERROR = None


# ---------------------------------------------------------------------------------------------
# safetensors (F32 as cleave writes it; no dependency on the safetensors package)

def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if entry["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {key} is {entry['dtype']}, only F32 is read")
        b, e = entry["data_offsets"]
        arr = np.frombuffer(data[8 + n + b:8 + n + e], dtype="<f4").reshape(entry["shape"])
        out[key] = torch.from_numpy(arr.copy())
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for key, t in tensors.items():
        raw = t.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes()
        header[key] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# ---------------------------------------------------------------------------------------------
# the model

if torch is not None:
    class PositionEmbedding(nn.Module):
        """y = x + weight, weight (positions, width): cleave's position_embedding."""

        def __init__(self, t, c):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(t, c))

        def forward(self, x):
            return x + self.weight

    class CausalSelfAttention(nn.Module):
        """nanoGPT's CausalSelfAttention without dropout (q, k, v rows of c_attn, heads side by side)."""

        def __init__(self, c, heads):
            super().__init__()
            self.heads = heads
            self.c_attn = nn.Linear(c, 3 * c)
            self.c_proj = nn.Linear(c, c)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(c, dim=2)
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Mlp(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c_fc = nn.Linear(c, 4 * c)
            self.c_proj = nn.Linear(4 * c, c)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        """cleave's transformer_block: r = x + attn(ln_1(x)); y = r + mlp(ln_2(r))."""

        def __init__(self, c, heads):
            super().__init__()
            self.ln_1 = nn.LayerNorm(c)
            self.attn = CausalSelfAttention(c, heads)
            self.ln_2 = nn.LayerNorm(c)
            self.mlp = Mlp(c)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class TiedLinear(nn.Module):
        """A linear layer whose weight is an embedding's table (nanoGPT's lm_head = wte): only the bias is its own."""

        def __init__(self, embedding, bias):
            super().__init__()
            self.embedding = [embedding]  # a list: not registered, so the table is exported once
            self.bias = nn.Parameter(torch.zeros(embedding.weight.shape[0])) if bias else None

        def forward(self, x):
            return F.linear(x, self.embedding[0].weight, self.bias)

    class Gelu(nn.Module):
        def __init__(self, approximate):
            super().__init__()
            self.approximate = approximate

        def forward(self, x):
            return F.gelu(x, approximate=self.approximate)


def build_gpt(path):
    """nn.Sequential for a cleave GPT model file; returns (model, context)."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("loss", "cross_entropy") != "cross_entropy" or len(doc["input"]) != 1:
        raise ValueError(f"{path}: not a byte-level language model (input (T), cross_entropy)")
    t = doc["input"][0]
    shape = [t]
    mods = []
    for i, layer in enumerate(doc["layers"]):
        kind = layer.get("type")
        try:
            if kind == "embedding":
                mods.append(nn.Embedding(layer["num_embeddings"], layer["embedding_dim"]))
                shape = [t, layer["embedding_dim"]]
            elif kind == "position_embedding":
                mods.append(PositionEmbedding(shape[0], shape[1]))
            elif kind == "transformer_block":
                mods.append(Block(shape[1], layer["heads"]))
            elif kind == "layernorm":
                mods.append(nn.LayerNorm(shape[-1], eps=layer.get("eps", 1e-5)))
            elif kind == "gelu":
                mods.append(Gelu(layer.get("approximate", "none")))
            elif kind == "linear":
                out, bias = layer["out_features"], layer.get("bias", True)
                if "tied_to" in layer:
                    mods.append(TiedLinear(mods[layer["tied_to"]], bias))
                else:
                    mods.append(nn.Linear(shape[-1], out, bias=bias))
                shape = shape[:-1] + [out]
            else:
                raise ValueError(f"layer type {kind!r} is not part of a cleave GPT")
        except (KeyError, IndexError, TypeError) as e:
            raise ValueError(f"{path}: layer {i} ({kind}): {e}") from None
    if shape != [t, 256]:
        raise ValueError(f"{path}: the output must be (T, 256) logits, got {shape}")
    return nn.Sequential(*mods), t


def init_like_cleave(model, seed):
    """cleave's initialisation scheme (docs/models.md), from torch's generator."""
    torch.manual_seed(seed)
    for i, m in enumerate(model):
        if isinstance(m, (nn.Embedding, PositionEmbedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif isinstance(m, Block):
            for name, p in m.named_parameters():
                if name.startswith("ln_"):
                    nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
                elif name.endswith("weight"):
                    nn.init.normal_(p, 0.0, 0.02)
                else:
                    nn.init.zeros_(p)
        elif isinstance(m, nn.Linear):
            bound = 1.0 / math.sqrt(m.in_features)  # cleave's linear: U(+-1/sqrt(in)) for weight and bias
            nn.init.uniform_(m.weight, -bound, bound)
            if m.bias is not None:
                nn.init.uniform_(m.bias, -bound, bound)
        elif isinstance(m, TiedLinear) and m.bias is not None:
            bound = 1.0 / math.sqrt(m.embedding[0].weight.shape[1])
            nn.init.uniform_(m.bias, -bound, bound)


# ---------------------------------------------------------------------------------------------
# data: cleave's split and windows (core/data/text.cpp)

def text_split(path):
    with open(path, "rb") as f:
        data = f.read()
    n = len(data)
    cut = n // 10 * 9 + (n % 10) * 9 // 10  # floor(0.9 n)
    return np.frombuffer(data[:cut], dtype=np.uint8), np.frombuffer(data[cut:], dtype=np.uint8)


def validation_windows(val, t, limit):
    count = (len(val) - 1) // t
    if limit is not None and limit >= 0:
        count = min(count, limit)
    x = val[:count * t].reshape(count, t)
    y = val[1:count * t + 1].reshape(count, t)
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


@torch.no_grad() if torch is not None else (lambda f: f)
def validation_loss(model, x, y, batch=256):
    """Mean cross-entropy per byte over the windows, summed in float64."""
    model.eval()
    total = 0.0
    for s in range(0, len(x), batch):
        logits = model(x[s:s + batch])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[s:s + batch].reshape(-1),
                                 reduction="sum").double().item()
    return total / (len(x) * x.shape[1])


# ---------------------------------------------------------------------------------------------
# optimizer and schedule: cleave's (core/optim, docs/checkpoints.md)

def make_optimizer(model, a):
    params = list(model.parameters())
    if a.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, weight_decay=a.weight_decay)
    if a.optimizer == "adam":
        return torch.optim.Adam(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, weight_decay=a.weight_decay)
    if a.optimizer == "sgd":
        return torch.optim.SGD(params, lr=a.lr, weight_decay=a.weight_decay)
    raise ValueError(f"--optimizer must be sgd, adam or adamw, got {a.optimizer!r}")


def lr_at(a, s, total):
    w = a.warmup_steps
    if s < w:
        return a.lr * (s + 1) / w
    t = s - w
    if a.lr_schedule == "constant":
        return a.lr
    if a.lr_schedule == "cosine":
        frac = min(1.0, t / max(1, total - w))
        return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * frac))
    raise ValueError(f"--lr-schedule must be constant or cosine, got {a.lr_schedule!r}")


# ---------------------------------------------------------------------------------------------
# commands

def cmd_eval(a):
    model, t = build_gpt(a.model)
    state = read_safetensors(a.weights)
    model.load_state_dict(state, strict=True)
    _, val = text_split(a.text)
    x, y = validation_windows(val, t, a.limit_test)
    loss = validation_loss(model, x, y)
    return {"val_loss": loss, "val_bits_per_byte": loss / math.log(2), "windows": len(x), "context": t}


def cmd_train(a):
    model, t = build_gpt(a.model)
    init_like_cleave(model, a.seed)
    if a.init:
        model.load_state_dict(read_safetensors(a.init), strict=True)
    train, val = text_split(a.text)
    vx, vy = validation_windows(val, t, a.limit_test)
    opt = make_optimizer(model, a)
    g = torch.Generator().manual_seed(a.seed)
    data = torch.from_numpy(train.astype(np.int64))
    ar = torch.arange(t)
    losses, val_losses = [], []
    t0 = time.perf_counter()
    for s in range(a.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(a, s, a.steps)
        model.train()
        offs = torch.randint(0, len(data) - t, (a.batch,), generator=g)
        x = data[offs[:, None] + ar]
        y = data[offs[:, None] + ar + 1]
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        losses.append(loss.item())
        if a.eval_every and (s + 1) % a.eval_every == 0 and s + 1 < a.steps:
            val_losses.append({"step": s + 1, "val_loss": validation_loss(model, vx, vy)})
    seconds = time.perf_counter() - t0
    loss = validation_loss(model, vx, vy)
    val_losses.append({"step": a.steps, "val_loss": loss})
    return {"losses": losses, "val_loss": loss, "val_bits_per_byte": loss / math.log(2), "val_losses": val_losses,
            "seconds": seconds, "steps": a.steps, "batch": a.batch, "windows": len(vx),
            "tokens_per_sec": a.steps * a.batch * t / seconds}


def cmd_throughput(a):
    model, t = build_gpt(a.model)
    init_like_cleave(model, a.seed)
    opt = make_optimizer(model, a)
    g = torch.Generator().manual_seed(a.seed)
    batches = [(torch.randint(0, 256, (a.batch, t), generator=g), torch.randint(0, 256, (a.batch, t), generator=g))
               for _ in range(4)]
    model.train()

    def step(i):
        x, y = batches[i % 4]
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.item()  # cleave's trainer brings the loss to the host every step too

    for i in range(a.warmup):
        step(i)
    rates = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        for i in range(a.steps):
            step(i)
        rates.append(a.steps * a.batch * t / (time.perf_counter() - t0))
    return {"tokens_per_sec": rates, "median_tokens_per_sec": statistics.median(rates), "steps": a.steps,
            "reps": a.reps, "batch": a.batch, "context": t}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["eval", "train", "throughput"])
    ap.add_argument("--model", required=True, help="cleave GPT model JSON file")
    ap.add_argument("--weights", help="eval: safetensors written by `cleave export`")
    ap.add_argument("--text", help="eval, train: the text file (cleave's --text)")
    ap.add_argument("--limit-test", type=int, default=None, help="validation windows (cleave's --limit-test)")
    ap.add_argument("--init", help="train: start from these safetensors instead of a fresh initialisation")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch's default)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=None, help="default: 0.01 for adamw, else 0 (as cleave)")
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--lr-schedule", default="constant")
    ap.add_argument("--warmup-steps", type=int, default=0)
    ap.add_argument("--min-lr", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=0, help="train: validation loss every N steps too")
    ap.add_argument("--warmup", type=int, default=3, help="throughput: untimed steps first")
    ap.add_argument("--reps", type=int, default=3, help="throughput: timed repetitions")
    a = ap.parse_args()
    if torch is None:
        fail(TORCH_ERROR, 3)
    if a.weight_decay is None:
        a.weight_decay = 0.01 if a.optimizer == "adamw" else 0.0
    if a.threads < 0 or a.steps < 1 or a.batch < 1 or a.reps < 1 or a.warmup < 0:
        fail("--steps, --batch and --reps must be >= 1; --threads and --warmup >= 0")
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    need = {"eval": ["weights", "text"], "train": ["text"], "throughput": []}[a.command]
    for k in need:
        if getattr(a, k) is None:
            fail(f"{a.command} needs --{k}")
    try:
        out = {"eval": cmd_eval, "train": cmd_train, "throughput": cmd_throughput}[a.command](a)
    except (OSError, ValueError, KeyError, RuntimeError, json.JSONDecodeError) as e:
        fail(f"{type(e).__name__}: {e}")
    out.update({"ok": True, "torch": torch.__version__, "threads": torch.get_num_threads(), "model": a.model})
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
