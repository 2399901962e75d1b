#!/usr/bin/env python
"""A small but real PyTorch training job that survives preemption.

It fits an MLP to a synthetic regression task (a fixed random "teacher" network plus noise), on
the GPU when ``CUDA_VISIBLE_DEVICES`` gives it one, else on the CPU. It follows the quota task
protocol:

- checkpoints every ``--checkpoint-every`` steps into ``$QUOTA_CHECKPOINT_DIR``
  (``ckpt-<step>.pt``, written to a temporary name and renamed, so a checkpoint is whole or absent);
- resumes from ``$QUOTA_RESUME_FROM`` when it is set (model, optimizer, step and RNG state), so
  the loss curve continues where it stopped;
- on SIGTERM finishes the current step, writes a checkpoint and exits with code 143 at once.

Data batches are derived from ``(seed, step)``, so a resumed run sees exactly the batches an
uninterrupted run would have seen.

``--events FILE`` appends one JSON line per event (start, checkpoint, sigterm, exit) for
dashboards and tests. Run it by hand::

    QUOTA_CHECKPOINT_DIR=/tmp/ckpt python dags/scripts/train_mlp.py --steps 300
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn

EXIT_PREEMPTED = 128 + signal.SIGTERM
KEEP_CHECKPOINTS = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000, help="total optimisation steps")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step (to watch it in the UI)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--events", type=Path, default=None, help="append JSON-lines events here")
    args = p.parse_args(argv)
    for name in ("steps", "checkpoint_every", "batch_size", "features", "hidden"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    return args


class Events:
    def __init__(self, path: Path | None) -> None:
        self.path = path

    def emit(self, event: str, **fields) -> None:
        record = {"event": event, "time": time.time(), "pid": os.getpid(), **fields}
        print(json.dumps(record), flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def make_model(features: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def batch(step: int, args: argparse.Namespace, teacher: nn.Module, device: torch.device):
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    x = torch.randn(args.batch_size, args.features, generator=g)
    with torch.no_grad():
        y = teacher(x) + 0.01 * torch.randn(args.batch_size, 1, generator=g)
    return x.to(device), y.to(device)


def save_checkpoint(ckpt_dir: Path, step: int, model, optimizer, loss: float) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"ckpt-{step:08d}.pt"
    tmp = ckpt_dir / f".{final.name}.tmp"
    torch.save(
        {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "loss": loss},
        tmp,
    )
    os.replace(tmp, final)
    for old in sorted(ckpt_dir.glob("ckpt-*.pt"))[:-KEEP_CHECKPOINTS]:
        old.unlink(missing_ok=True)
    return final


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    events = Events(args.events)
    stop = {"requested": False}

    def on_sigterm(signum, frame):
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_sigterm)

    ckpt_dir = Path(os.environ.get("QUOTA_CHECKPOINT_DIR") or "checkpoints")
    resume_from = os.environ.get("QUOTA_RESUME_FROM") or ""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    torch.manual_seed(args.seed)
    teacher = make_model(args.features, 16)
    model = make_model(args.features, args.hidden).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start_step = 0
    if resume_from:
        state = torch.load(resume_from, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step = state["step"]
    events.emit(
        "start",
        start_step=start_step,
        resume_from=resume_from,
        device=str(device),
        gpu_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        preemption_count=int(os.environ.get("QUOTA_PREEMPTION_COUNT") or 0),
    )

    loss_fn = nn.MSELoss()
    loss_value = float("nan")
    step = start_step
    while step < args.steps:
        x, y = batch(step, args, teacher, device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        loss_value = loss.item()
        if stop["requested"]:
            events.emit("sigterm", step=step)
            path = save_checkpoint(ckpt_dir, step, model, optimizer, loss_value)
            events.emit("checkpoint", step=step, path=str(path), loss=loss_value, reason="sigterm")
            events.emit("exit", step=step, code=EXIT_PREEMPTED)
            return EXIT_PREEMPTED
        if step % args.checkpoint_every == 0:
            path = save_checkpoint(ckpt_dir, step, model, optimizer, loss_value)
            events.emit("checkpoint", step=step, path=str(path), loss=loss_value, reason="interval")
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if step % args.checkpoint_every:
        save_checkpoint(ckpt_dir, step, model, optimizer, loss_value)
    events.emit("exit", step=step, code=0, loss=loss_value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
