"""DAGs of the QuotaExecutor integration tests; each scenario has its own job queue (quotas.yaml)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pendulum

from airflow.sdk import DAG, task
from airflow_quota_provider.operators.training import QuotaTrainingOperator

STUB = Path(__file__).resolve().parents[1] / "train_stub.py"
START = pendulum.datetime(2026, 1, 1, tz="UTC")


def record(event: str, **fields) -> None:
    from airflow.sdk import get_current_context

    ti = get_current_context()["ti"]
    line = {
        "t": time.time(),
        "event": event,
        "dag_id": ti.dag_id,
        "task_id": ti.task_id,
        "run_id": ti.run_id,
        "try_number": ti.try_number,
        "pid": os.getpid(),
        "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "job_id": os.environ.get("QUOTA_JOB_ID"),
        "preemptions": os.environ.get("QUOTA_PREEMPTION_COUNT"),
        **fields,
    }
    root = Path(os.environ.get("QUOTA_TEST_RECORDS", "/tmp"))
    with open(root / f"task-{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def train(task_id: str, quota: str, *, gpus: int = 1, priority: int = 0, steps: int = 10, step_s: float = 1.0, **kw):
    return QuotaTrainingOperator(
        task_id=task_id,
        quota=quota,
        gpus=gpus,
        priority=priority,
        command=[sys.executable, str(STUB), task_id, str(steps), str(step_s)],
        **kw,
    )


def plain_sleep(task_id: str, pool: str, seconds: float, *, priority: int = 0, pool_slots: int = 1, **kw):
    """A plain Python task that knows nothing of the preemption protocol."""

    @task(task_id=task_id, pool=pool, pool_slots=pool_slots, priority_weight=priority,
          weight_rule="absolute", executor="quota", **kw)
    def _sleep():
        record("start")
        time.sleep(seconds)
        record("done")

    return _sleep()


# Borrowing and reclaim (queue q-borrow: team-a 2 + team-b 2 GPUs, grace 6 s).
with DAG("borrow_b", schedule=None, start_date=START, catchup=False):
    for i in range(4):
        train(f"b{i}", "team-b", priority=10, steps=16, step_s=1.0)

with DAG("reclaim_a", schedule=None, start_date=START, catchup=False):
    for i in range(2):
        train(f"a{i}", "team-a", priority=10, steps=3, step_s=1.0)

# Within-quota preemption of a plain task by priority (queue q-prio: team-p 1 GPU, grace 3 s).
with DAG("prio_low", schedule=None, start_date=START, catchup=False):
    plain_sleep("low", "team-p", 14, priority=1)

with DAG("prio_high", schedule=None, start_date=START, catchup=False):
    plain_sleep("high", "team-p", 3, priority=50)

# set-priority changes who runs next (queue q-set: team-s 1 GPU, within_quota never).
with DAG("set_block", schedule=None, start_date=START, catchup=False):
    plain_sleep("block", "team-s", 30, priority=1)  # the test holds it stopped (SIGSTOP) until the new priority is set

with DAG("set_waiters", schedule=None, start_date=START, catchup=False):
    plain_sleep("w1", "team-s", 1, priority=10)
    plain_sleep("w2", "team-s", 1, priority=5)

# max_preemptions 0: the first preemption fails the task (queue q-limit: team-l 1 GPU).
with DAG("limit_victim", schedule=None, start_date=START, catchup=False):
    train("victim", "team-l", priority=1, steps=30, step_s=1.0)

with DAG("limit_preemptor", schedule=None, start_date=START, catchup=False):
    plain_sleep("preemptor", "team-l", 2, priority=50)

# Jobs that can never run fail; the others run (queue q-rej: team-r 1 GPU).
with DAG("reject", schedule=None, start_date=START, catchup=False):
    plain_sleep("unknown_quota", "default_pool", 1, executor_config={"quota": {"quota": "no-such-team"}})
    plain_sleep("unknown_pool", "no-such-pool", 1)
    plain_sleep("too_many_gpus", "team-r", 1, pool_slots=5)
    plain_sleep("fits", "team-r", 1)

# A job that waits longer than task_queued_timeout still runs (queue q-wait: team-w 1 GPU).
with DAG("queued_timeout", schedule=None, start_date=START, catchup=False):
    plain_sleep("hold", "team-w", 25, priority=10)
    plain_sleep("waiter", "team-w", 1, priority=1)

# Scheduler killed and restarted while these run (queue q-kill: team-k 2 GPUs).
with DAG("survive_restart", schedule=None, start_date=START, catchup=False):
    for i in range(4):
        train(f"k{i}", "team-k", priority=10, steps=10, step_s=1.0)

# A command that escapes into a session of its own and ignores SIGTERM, preempted (queue q-escape:
# team-e 1 GPU, grace 3 s). It escapes on its first run only, so that its rerun ends quickly.
with DAG("escape_low", schedule=None, start_date=START, catchup=False):

    @task(task_id="escaper", pool="team-e", priority_weight=1, weight_rule="absolute", executor="quota")
    def _escaper():
        import subprocess

        if os.environ.get("QUOTA_PREEMPTION_COUNT", "0") == "0":
            child = subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 0.2; done"], start_new_session=True)
            record("escaped", escaped_pid=child.pid)
            time.sleep(120)
        record("done")

    _escaper()

with DAG("escape_high", schedule=None, start_date=START, catchup=False):

    @task(task_id="preemptor", pool="team-e", priority_weight=50, weight_rule="absolute", executor="quota")
    def _preemptor():
        root = Path(os.environ["QUOTA_TEST_RECORDS"])
        lines = [json.loads(line) for path in root.glob("*.jsonl") for line in path.read_text().splitlines() if line]
        pids = [line["escaped_pid"] for line in lines if line["event"] == "escaped"]
        try:
            state = Path(f"/proc/{pids[0]}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            state = "gone"
        record("start", escaped_pid=pids[0] if pids else None, escaped_state=state)

    _preemptor()

# Usage accounting (queue q-usage: usage-a 1 + usage-b 2 GPUs, no common pool, grace 2 s): usage-b
# borrows usage-a's GPU, usage-a reclaims it, then a within-quota preemption in usage-a. Every task is
# the checkpointing stub, so each run records its start and end (sigterm or done).
with DAG("usage_borrow", schedule=None, start_date=START, catchup=False):
    for i in range(3):
        train(f"ub{i}", "usage-b", priority=1, steps=12, step_s=1.0)

with DAG("usage_reclaim", schedule=None, start_date=START, catchup=False):
    train("ua_low", "usage-a", priority=5, steps=8, step_s=1.0)

with DAG("usage_within", schedule=None, start_date=START, catchup=False):
    train("ua_high", "usage-a", priority=50, steps=3, step_s=1.0)


# A gang on the local launcher: both nodes on this machine, each with GPUs of its own.
GANG_PROBE = (
    "import json, os, time; keys = ('QUOTA_NODE_RANK', 'QUOTA_NNODES', 'CUDA_VISIBLE_DEVICES', 'MASTER_ADDR', "
    "'MASTER_PORT', 'WORLD_SIZE', 'QUOTA_HOST', 'QUOTA_CHECKPOINT_DIR'); "
    "line = {'t': time.time(), 'event': 'gang_node', **{k: os.environ.get(k) for k in keys}}; "
    "open(os.path.join(os.environ['QUOTA_TEST_RECORDS'], f'gang-{os.getpid()}.jsonl'), 'a').write(json.dumps(line) + '\\n'); "
    "time.sleep(2)"
)
with DAG("gang_local", schedule=None, start_date=START, catchup=False):
    QuotaTrainingOperator(task_id="pair", quota="team-g", gpus=2, nodes=2, command=[sys.executable, "-c", GANG_PROBE])
