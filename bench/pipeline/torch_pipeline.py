#!/usr/bin/env python3
"""torch_pipeline.py: a cleave GPT trained by torch.distributed.pipelining, the pipeline bench_pipeline compares with.

The model is bench/gpt/torch_gpt.py's (models/gpt-*.json built layer for layer
as cleave builds it, cleave's initialisation scheme), cut into stages at the
layer boundaries of --cut (cleave's plan: "0:4,4:8" is layers [0, 4) and
[4, 8)), one process per stage (gloo on 127.0.0.1, torch.set_num_threads(1)
each), trained with AdamW (weight decay 0.01, as cleave's adamw) on random
context windows of --text, batch --batch in --microbatches micro-batches.

Schedules (--schedule): gpipe (ScheduleGPipe), 1f1b (Schedule1F1B) and zb1
(ScheduleInterleavedZeroBubble with one stage per rank: ZB1P of Qi et al., the
schedule cleave's zb1 implements; PyTorch's zero-bubble schedules are
"multi-stage" ones that also run with a single stage per rank).

Prints one JSON object on stdout: {"ok": true, "tokens_per_sec": median over
the timed steps (the time between consecutive steps' ends on rank 0, after
--warmup untimed steps), "mean_tokens_per_sec", "step_seconds": [...],
"losses": [...], ...}, or {"ok": false, "error": "..."} with exit status 2 (bad
arguments, a failed run) or 3 (torch missing).
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpt"))
import torch_gpt  # noqa: E402  (the model, its initialisation and cleave's text split)

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "zb1": "ScheduleInterleavedZeroBubble"}


def parse_cut(text, layers):
    """'0:4,4:8' -> [(0, 4), (4, 8)]; the ranges must be contiguous and cover every layer."""
    try:
        cut = [tuple(int(v) for v in part.split(":")) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--cut {text!r}: expected BEGIN:END,BEGIN:END,... (layer indices)") from None
    if any(len(c) != 2 for c in cut) or cut[0][0] != 0 or cut[-1][1] != layers or \
            any(a >= b for a, b in cut) or any(cut[i][1] != cut[i + 1][0] for i in range(len(cut) - 1)):
        raise ValueError(f"--cut {text!r}: stages must be contiguous, non-empty and cover layers 0..{layers}")
    return cut


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_schedule(a, stage):
    import torch.nn.functional as F
    from torch.distributed import pipelining

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    cls = getattr(pipelining, SCHEDULES[a.schedule])
    if a.schedule == "zb1":
        return cls([stage], n_microbatches=a.microbatches, loss_fn=loss_fn)
    return cls(stage, n_microbatches=a.microbatches, loss_fn=loss_fn)


def worker(rank, a, cut, port, result_path):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=len(cut))
    try:
        model, t = torch_gpt.build_gpt(a.model)
        torch_gpt.init_like_cleave(model, a.seed)
        begin, end = cut[rank]
        part = torch.nn.Sequential(*list(model)[begin:end])
        part.train()
        stage = PipelineStage(part, rank, len(cut), torch.device("cpu"))
        schedule = make_schedule(a, stage)
        opt = torch.optim.AdamW(part.parameters(), lr=a.lr, weight_decay=0.01)
        train, _ = torch_gpt.text_split(a.text)
        data = torch.from_numpy(train.astype("int64"))
        g = torch.Generator().manual_seed(a.seed)  # every rank draws the same windows
        ar = torch.arange(t)
        ends, losses = [], []
        for s in range(a.warmup + a.steps):
            offs = torch.randint(0, len(data) - t - 1, (a.batch,), generator=g)
            x, y = data[offs[:, None] + ar], data[offs[:, None] + ar + 1]
            mb_losses = []
            if rank == 0:
                schedule.step(x)
            elif rank == len(cut) - 1:
                schedule.step(target=y, losses=mb_losses)
            else:
                schedule.step()
            opt.step()
            opt.zero_grad(set_to_none=False)
            if mb_losses:
                losses.append(sum(float(v.detach()) for v in mb_losses) / len(mb_losses))
            if s + 1 >= a.warmup:
                ends.append(time.perf_counter())
        gathered = [None] * len(cut) if rank == 0 else None
        dist.gather_object({"ends": ends, "losses": losses}, gathered, dst=0)
        if rank == 0:
            step_seconds = [b - e for e, b in zip(ends, ends[1:])]
            tokens = a.batch * t
            out = {"ok": True, "torch": torch.__version__, "schedule": a.schedule,
                   "class": SCHEDULES[a.schedule], "stages": len(cut), "cut": [list(c) for c in cut],
                   "microbatches": a.microbatches, "batch": a.batch, "context": t, "steps": a.steps,
                   "warmup": a.warmup, "threads_per_stage": torch.get_num_threads(),
                   "step_seconds": step_seconds,
                   "tokens_per_sec": tokens / statistics.median(step_seconds),
                   "mean_tokens_per_sec": tokens * len(step_seconds) / (ends[-1] - ends[0]),
                   "losses": gathered[-1]["losses"]}
            with open(result_path, "w") as f:
                json.dump(out, f)
    finally:
        dist.destroy_process_group()


def run(a):
    import torch.multiprocessing as mp
    import tempfile

    model, _ = torch_gpt.build_gpt(a.model)
    cut = parse_cut(a.cut, len(model))
    rounds = max(1, a.microbatches // len(cut))  # ScheduleInterleavedZeroBubble's own requirement
    if a.schedule == "zb1" and a.microbatches % rounds:
        raise ValueError(f"zb1: PyTorch's zero-bubble schedule needs --microbatches ({a.microbatches}) to be a "
                         f"multiple of its rounds, microbatches // stages = {rounds}")
    if a.batch % a.microbatches:
        raise ValueError(f"--batch {a.batch} is not a multiple of --microbatches {a.microbatches}")
    with tempfile.TemporaryDirectory(prefix="torch-pipeline-") as d:
        path = os.path.join(d, "result.json")
        mp.spawn(worker, args=(a, cut, free_port(), path), nprocs=len(cut), join=True)
        with open(path) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="cleave GPT model JSON file")
    ap.add_argument("--text", required=True, help="text to train on (cleave's --text)")
    ap.add_argument("--cut", required=True, help="stages as layer ranges: 0:4,4:8")
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if torch_gpt.torch is None:
        torch_gpt.fail(torch_gpt.TORCH_ERROR, 3)
    if a.steps < 2 or a.batch < 1 or a.microbatches < 1 or a.warmup < 1:
        torch_gpt.fail("--steps must be >= 2; --batch, --microbatches and --warmup >= 1")
    try:
        out = run(a)
    except Exception as e:  # a failed worker arrives as mp.ProcessRaisedException
        if not isinstance(e, ValueError):  # bad arguments need no traceback
            traceback.print_exc(file=sys.stderr)
        torch_gpt.fail(f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
