"""DAGs of the fleet tests: one job queue of three 4-GPU hosts, team-a and team-b 6 GPUs each; and
a job queue with GPU types, team-c and team-d (tests/fleet/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pendulum

from airflow.sdk import DAG
from airflow_quota_provider.operators.training import QuotaTrainingOperator

STUB = Path(__file__).resolve().parents[2] / "executors" / "train_stub.py"
START = pendulum.datetime(2026, 1, 1, tz="UTC")


def train(task_id: str, quota: str, *, gpus: int, priority: int = 10, steps: int = 10, step_s: float = 0.5,
          gpu_type: str | None = None):
    return QuotaTrainingOperator(
        task_id=task_id,
        quota=quota,
        gpus=gpus,
        priority=priority,
        gpu_type=gpu_type,
        command=[sys.executable, str(STUB), task_id, str(steps), str(step_s)],
    )


# Placement: a 4-GPU job and two 3-GPU jobs fill the hosts 4+3+3; a 2-GPU job then waits for
# fragmentation although its quota has room.
with DAG("frag_fill", schedule=None, start_date=START, catchup=False):
    train("big4", "team-a", gpus=4, steps=40)
    train("mid3_x", "team-b", gpus=3, steps=40)
    train("mid3_y", "team-b", gpus=3, steps=40)

with DAG("frag_small", schedule=None, start_date=START, catchup=False):
    train("small2", "team-a", gpus=2, steps=2)

# Borrow then reclaim across hosts: team-b fills all three hosts (6 GPUs borrowed); team-a's 4-GPU
# job takes back a host from team-b's lowest-priority job, which resumes on the host that frees next.
with DAG("fleet_borrow_b", schedule=None, start_date=START, catchup=False):
    train("b_victim", "team-b", gpus=4, priority=5, steps=60)
    train("b_short", "team-b", gpus=4, priority=10, steps=40)
    train("b_long", "team-b", gpus=4, priority=10, steps=110)

with DAG("fleet_reclaim_a", schedule=None, start_date=START, catchup=False):
    train("a_reclaim", "team-a", gpus=4, steps=80)

# A host dies under two 2-GPU jobs (best fit puts both on one host).
with DAG("host_loss", schedule=None, start_date=START, catchup=False):
    train("k0", "team-a", gpus=2, steps=60)
    train("k1", "team-a", gpus=2, steps=60)

# A gang: two nodes of 4 GPUs (8, 2 of them borrowed from team-a) running torch.distributed through
# torchrun, one process per node (the GPUs are virtual: it trains on the CPU). Then team-a takes
# its GPUs back: a 4-GPU job fills the idle host, a 2-GPU one needs the gang's, which checkpoints on
# both nodes and resumes on another pair of hosts once the 4-GPU job is done.
GANG = Path(__file__).resolve().parents[1] / "gang_train.py"


def gang(task_id: str, quota: str, *, steps: int, step_s: float = 0.5, priority: int = 5):
    return QuotaTrainingOperator(
        task_id=task_id,
        quota=quota,
        gpus=4,
        nodes=2,
        priority=priority,
        env={"GLOO_SOCKET_IFNAME": "lo"},
        command=f"{sys.executable} -m torch.distributed.run --nnodes=$QUOTA_NNODES --nproc-per-node=1 "
        "--node-rank=$QUOTA_NODE_RANK --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT "
        f"{GANG} {task_id} {steps} {step_s}",
    )


with DAG("gang_borrow_b", schedule=None, start_date=START, catchup=False):
    gang("ddp", "team-b", steps=60)

with DAG("gang_reclaim_a", schedule=None, start_date=START, catchup=False):
    train("a_fill", "team-a", gpus=4, priority=10, steps=16)
    train("a_reclaim", "team-a", gpus=2, priority=10, steps=80)

# A gang whose node 1 fails: node 0 (a long sleep) is stopped and the task fails naming node 1.
with DAG("gang_node_fails", schedule=None, start_date=START, catchup=False):
    QuotaTrainingOperator(
        task_id="split", quota="team-a", gpus=1, nodes=2, retries=0,
        command='if [ "$QUOTA_NODE_RANK" = 1 ]; then sleep 2; exit 3; fi; sleep 600',
    )

# A gang whose member's host dies: both nodes record their start and sleep; the gang is evicted as one.
GANG_SLEEP = (
    "import json, os, time; line = {'t': time.time(), 'event': 'start', 'name': 'pair', "
    "'node': os.environ['QUOTA_NODE_RANK'], 'host': os.environ['QUOTA_HOST']}; "
    "open(os.path.join(os.environ['QUOTA_TEST_RECORDS'], f'cmd-{os.getpid()}.jsonl'), 'a').write(json.dumps(line) + '\\n'); "
    "time.sleep(15)"
)
with DAG("gang_host_loss", schedule=None, start_date=START, catchup=False):
    QuotaTrainingOperator(task_id="pair", quota="team-a", gpus=1, nodes=2, command=[sys.executable, "-c", GANG_SLEEP])

# GPU types: team-d borrows on both types, its a100 job at the lower priority; team-c then asks for
# its h100 GPU back (a reclaim on h100 only) and runs an untyped job, which fits within its quota on
# a100 only.
with DAG("types_hold", schedule=None, start_date=START, catchup=False):
    train("d_h100", "team-d", gpus=2, priority=5, steps=40, gpu_type="h100")
    train("d_a100", "team-d", gpus=2, priority=1, steps=40, gpu_type="a100")

with DAG("types_ask", schedule=None, start_date=START, catchup=False):
    train("c_h100", "team-c", gpus=1, steps=20, gpu_type="h100")
    train("c_any", "team-c", gpus=2, steps=4)
