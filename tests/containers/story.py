"""The README's borrow-then-reclaim story, with the example DAGs and examples/quotas.yaml (an 8-GPU
job queue: team-a owns 4, team-b 2, inference 2 reserved), run on any stack that the container
tests bring up: team B's sweep borrows team A's idle GPUs, team A's fine-tune reclaims two of them,
the two victims checkpoint, wait, and resume from their checkpoints without using a retry."""

from __future__ import annotations

import re
from pathlib import Path

from tests.integration_support import AirflowInstance, wait_for

# Up to eight training processes share this machine's two cores: one thread each, or PyTorch's
# spinning threads slow every step tenfold. A property of the test machine, not of the stacks.
TRAINING_ENV = {"OMP_NUM_THREADS": "1"}

SWEEP, FINETUNE = "quota_team_b_sweep", "quota_team_a_finetune"
# Short runs for CI. The fine-tune arrives once every trial's training has started: a victim then
# checkpoints on SIGTERM and resumes from that checkpoint. On two busy cores the trials start up to
# 20 s and more apart, so each runs 40 s and more, long enough that none has finished by then.
SWEEP_CONF = {"steps": 400, "step_sleep": 0.1}
FINETUNE_CONF = {"steps": 100, "step_sleep": 0.01}
TRIALS = [f"trial_{i}" for i in range(6)]


def _running(stack: AirflowInstance, dag_id: str) -> list[str]:
    return [r["task_id"] for r in stack.sql("SELECT task_id FROM quota_job WHERE dag_id=? AND state='running'", dag_id)]


def borrow_then_reclaim(stack: AirflowInstance, *, checkpoints: Path, logs: Path, scheduler: str = "scheduler") -> None:
    """Run the story on ``stack``; ``checkpoints`` and ``logs``: where the stack's hosts must have
    written the victims' checkpoints and task logs; ``scheduler``: the log to show on a timeout."""
    sweep = stack.trigger(SWEEP, SWEEP_CONF)
    wait_for(lambda: len(_running(stack, SWEEP)) == 6, "all six trials of team B running", timeout=240,
             interval=2, on_timeout=lambda: stack.tail(scheduler))
    assert len(stack.events("borrowed", dag_id=SWEEP)) == 4  # team-b owns 2 GPUs, runs 6
    wait_for(lambda: all(_starts(logs, sweep, t) for t in TRIALS), f"every trial's training to start (task logs in {logs})",
             timeout=240, interval=1, on_timeout=lambda: stack.tail(scheduler))

    finetune = stack.trigger(FINETUNE, FINETUNE_CONF)
    assert stack.wait_run(FINETUNE, finetune, timeout=300) == "success"
    assert stack.wait_run(SWEEP, sweep, timeout=300) == "success"

    victims = sorted(e["task_id"] for e in stack.events("reclaimed", dag_id=SWEEP))
    assert len(victims) == 2, victims
    admitted = [e["task_id"] for e in stack.events("admitted", dag_id=SWEEP)]
    for victim in victims:
        assert admitted.count(victim) == 2, admitted  # ran, was preempted, ran again
        resumed = _resumed_from(logs, sweep, victim)
        assert resumed.resolve().is_relative_to(checkpoints.resolve()), (resumed, checkpoints)
    for dag_id, run_id in ((SWEEP, sweep), (FINETUNE, finetune)):
        for ti in stack.tis(dag_id, run_id).values():
            assert (ti["state"], ti["try_number"]) == ("success", 1), dict(ti)  # no retry used


def _starts(logs: Path, run_id: str, task_id: str) -> list[tuple[int, str]]:
    """(start_step, resume_from) of each start of the training script, read from the task's log
    (the script prints a JSON "start" record; the task log holds it as an escaped string)."""
    text = "".join(p.read_text(errors="replace") for p in logs.rglob("*.log")
                   if f"task_id={task_id}" in str(p) and f"run_id={run_id}" in str(p))
    return [(int(step), path) for step, path in
            re.findall(r'start_step\\?"?: (\d+), \\?"resume_from\\?"?: \\?"([^"\\]*)', text)]


def _resumed_from(logs: Path, run_id: str, task_id: str) -> Path:
    """The checkpoint the task's second start resumed from."""
    starts = _starts(logs, run_id, task_id)
    assert len(starts) == 2 and starts[0] == (0, ""), starts
    step, path = starts[1]
    assert step > 0 and re.fullmatch(rf"ckpt-0*{step}\.pt", Path(path).name), starts
    return Path(path)
