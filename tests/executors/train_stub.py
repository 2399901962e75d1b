"""A training command for the integration tests: steps with a checkpoint after each, and a record
of what happened (start, resume point, SIGTERM, done) in ``$QUOTA_TEST_RECORDS``.

usage: train_stub.py NAME STEPS STEP_SECONDS
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def record(event: str, **fields) -> None:
    root = Path(os.environ.get("QUOTA_TEST_RECORDS", "/tmp"))
    line = {
        "t": time.time(),
        "event": event,
        "name": NAME,
        "pid": os.getpid(),
        "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "preemptions": os.environ.get("QUOTA_PREEMPTION_COUNT"),
        "host": os.environ.get("QUOTA_HOST"),
        "threads": os.environ.get("OMP_NUM_THREADS"),
        **fields,
    }
    with open(root / f"cmd-{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


NAME, STEPS, STEP_S = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
CKPT = Path(os.environ["QUOTA_CHECKPOINT_DIR"])
step = 0


def checkpoint() -> float:
    """Save the step; returns the checkpoint's modification time (what the scheduler sees of it)."""
    tmp, path = CKPT / f"step-{step:05d}.tmp", CKPT / f"step-{step:05d}"
    tmp.write_text(str(step))
    os.replace(tmp, path)
    return path.stat().st_mtime


def on_sigterm(signum, frame):
    record("sigterm", step=step)
    record("checkpointed", step=step, mtime=checkpoint())
    sys.exit(143)


signal.signal(signal.SIGTERM, on_sigterm)
resume = os.environ.get("QUOTA_RESUME_FROM") or ""
if resume:
    step = int(Path(resume).read_text())
record("start", step=step, resume_from=resume)
while step < STEPS:
    time.sleep(STEP_S)
    step += 1
    checkpoint()
record("done", step=step)
