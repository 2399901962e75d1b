#!/usr/bin/env python
"""A small but real PyTorch training job that survives preemption.

It fits an MLP to a synthetic regression task (a fixed random "teacher" network plus noise), on
the GPU when ``CUDA_VISIBLE_DEVICES`` gives it one, else on the CPU. It follows the quota task
protocol:

- checkpoints every ``--checkpoint-every`` steps into ``$QUOTA_CHECKPOINT_DIR``
  (``ckpt-<step>.pt``, written to a temporary name and renamed, so a checkpoint is whole or absent);
- resumes from ``$QUOTA_RESUME_FROM`` when it is set (model, optimizer and step), so the loss
  curve continues where it stopped;
- on SIGTERM finishes the current step, writes a checkpoint and exits with code 143 at once.

Data batches are derived from ``(seed, step)``, so a resumed run sees exactly the batches an
uninterrupted run would have seen.

Started by torchrun (``WORLD_SIZE`` > 1, e.g. on every node of a gang) it trains data-parallel:
torch.distributed with gloo (on the CPU, or the GPU where there is one) and DistributedDataParallel.
``--batch-size`` is then the global batch: each rank trains on its own slice of each step's batch, so
the run trains the model one process would, up to the order of float additions. Every rank resumes
from ``$QUOTA_RESUME_FROM``; rank 0 alone writes checkpoints (torch's convention). Each step
all-reduces the loss with a stop flag, so on SIGTERM (on any rank) every rank stops after the same
step, rank 0 checkpoints it and every rank exits with 143. Checkpoints are the same as a single
process's, so a run may resume on another number of nodes.

``--events FILE`` appends one JSON line per event (start, checkpoint, sigterm, exit) for
dashboards and tests. Run it by hand::

    QUOTA_CHECKPOINT_DIR=/tmp/ckpt python dags/scripts/train_mlp.py --steps 300

and data-parallel, two processes (one per node of a gang, see ``quota_team_a_pretrain``)::

    QUOTA_CHECKPOINT_DIR=/tmp/ckpt torchrun --nproc-per-node=2 dags/scripts/train_mlp.py --steps 300
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
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

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
    def __init__(self, path: Path | None, **common) -> None:
        self.path = path
        self.common = common  # fields of every record (a data-parallel run's rank)

    def emit(self, event: str, **fields) -> None:
        record = {"event": event, "time": time.time(), "pid": os.getpid(), **self.common, **fields}
        print(json.dumps(record), flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def make_model(features: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


class Ranks:
    """This process's place in a torchrun job: its ``rank`` of ``world`` (0 of 1 without torchrun)."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE") or 1)
        if self.distributed and "RANK" not in os.environ:  # e.g. a gang's node started without torchrun
            raise SystemExit(f"WORLD_SIZE={self.world} but RANK is not set: start this script with torchrun")
        self.rank = int(os.environ["RANK"]) if self.distributed else 0
        self.local_rank = int(os.environ.get("LOCAL_RANK") or 0)

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def agree(self, loss: torch.Tensor, stop_requested: bool) -> tuple[float, bool]:
        """The step's loss over every rank's slice of the batch (the mean of theirs, equal slices) and
        whether any rank was asked to stop, from one all-reduce: every rank stops after the same step."""
        if not self.distributed:
            return loss.item(), stop_requested
        reduced = torch.tensor([loss.item(), float(stop_requested)], dtype=torch.float64)
        dist.all_reduce(reduced)
        return reduced[0].item() / self.world, reduced[1].item() > 0


def batch(step: int, args: argparse.Namespace, teacher: nn.Module, device: torch.device, ranks: Ranks):
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    x = torch.randn(args.batch_size, args.features, generator=g)
    with torch.no_grad():
        y = teacher(x) + 0.01 * torch.randn(args.batch_size, 1, generator=g)
    if ranks.distributed:  # this rank's slice of the global batch
        x, y = x.chunk(ranks.world)[ranks.rank], y.chunk(ranks.world)[ranks.rank]
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
    ranks = Ranks()
    if args.batch_size % ranks.world:
        sys.exit(f"--batch-size: {args.batch_size} is not a multiple of WORLD_SIZE={ranks.world}; "
                 "each rank trains on an equal slice of the batch")
    if args.threads:
        torch.set_num_threads(args.threads)
    events = Events(args.events, **({"rank": ranks.rank, "world_size": ranks.world} if ranks.distributed else {}))
    stop = {"requested": False}

    def on_sigterm(signum, frame):
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_sigterm)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not ranks.distributed:
        return train(args, ranks, device, events, stop)
    if device.type == "cuda":
        torch.cuda.set_device(ranks.local_rank)  # torchrun's local rank: this node's GPU of this process
    dist.init_process_group("gloo")  # also on the GPU: the gloo collectives DDP needs take CUDA tensors
    try:
        return train(args, ranks, device, events, stop)
    finally:
        dist.destroy_process_group()


def train(args: argparse.Namespace, ranks: Ranks, device: torch.device, events: Events, stop: dict) -> int:
    ckpt_dir = Path(os.environ.get("QUOTA_CHECKPOINT_DIR") or "checkpoints")
    resume_from = os.environ.get("QUOTA_RESUME_FROM") or ""

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
    # Checkpoints hold the model itself, not DDP's wrapper ("module." names): any number of ranks resumes them.
    trained = DistributedDataParallel(model) if ranks.distributed else model
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
    writes_checkpoints = ranks.rank == 0
    while step < args.steps:
        x, y = batch(step, args, teacher, device, ranks)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(trained(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        loss_value, stopping = ranks.agree(loss, stop["requested"])
        if stopping:
            events.emit("sigterm", step=step)
            if writes_checkpoints:
                path = save_checkpoint(ckpt_dir, step, model, optimizer, loss_value)
                events.emit("checkpoint", step=step, path=str(path), loss=loss_value, reason="sigterm")
            events.emit("exit", step=step, code=EXIT_PREEMPTED)
            return EXIT_PREEMPTED
        if writes_checkpoints and step % args.checkpoint_every == 0:
            path = save_checkpoint(ckpt_dir, step, model, optimizer, loss_value)
            events.emit("checkpoint", step=step, path=str(path), loss=loss_value, reason="interval")
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if writes_checkpoints and step % args.checkpoint_every:
        save_checkpoint(ckpt_dir, step, model, optimizer, loss_value)
    events.emit("exit", step=step, code=0, loss=loss_value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
