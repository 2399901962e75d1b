"""A data-parallel "training" on a gang, for the fleet tests: torch.distributed (gloo, CPU) started by
torchrun on every node of the gang. Each step all-reduces ``(rank + 1) * step`` with a stop flag;
node 0's rank 0 checkpoints ``{"step", "total"}`` after every step. On SIGTERM a rank raises the
flag, and every rank stops after the same step (the reduced flag makes them agree), rank 0 having
checkpointed it. A run resumed from ``QUOTA_RESUME_FROM`` goes on from its step and total, so the
end total is the same as an uninterrupted run's: ``world * (world + 1) / 2 * STEPS * (STEPS + 1) / 2``.
Records (``QUOTA_TEST_RECORDS``, as train_stub.py): start, sigterm, checkpointed, done.

usage: gang_train.py NAME STEPS STEP_SECONDS
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

NAME, STEPS, STEP_S = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
CKPT = Path(os.environ["QUOTA_CHECKPOINT_DIR"])
stop = False


def record(event: str, **fields) -> None:
    line = {"t": time.time(), "event": event, "name": NAME, "pid": os.getpid(), "host": os.environ.get("QUOTA_HOST"),
            "node": os.environ.get("QUOTA_NODE_RANK"), "rank": dist.get_rank(), **fields}
    with open(Path(os.environ["QUOTA_TEST_RECORDS"]) / f"cmd-{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def on_sigterm(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_sigterm)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
resume = os.environ.get("QUOTA_RESUME_FROM") or ""
state = json.loads(Path(resume).read_text()) if resume else {"step": 0, "total": 0.0}
step, total = state["step"], state["total"]
record("start", step=step, resume_from=resume, world=world)
while step < STEPS:
    time.sleep(STEP_S)
    reduced = torch.tensor([float((rank + 1) * (step + 1)), float(stop)])
    dist.all_reduce(reduced)
    step, total = step + 1, total + reduced[0].item()
    if rank == 0:
        tmp, path = CKPT / f"step-{step:05d}.tmp", CKPT / f"step-{step:05d}"
        tmp.write_text(json.dumps({"step": step, "total": total}))
        os.replace(tmp, path)
    if reduced[1].item() > 0:
        record("sigterm", step=step)
        record("checkpointed", step=step)
        sys.exit(143)
record("done", step=step, total=total)
dist.destroy_process_group()
