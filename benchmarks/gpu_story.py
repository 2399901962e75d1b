"""The preemption and resume story on this machine's real GPUs, through a real Airflow 3.3.

One job queue holds every GPU ``nvidia-smi`` lists. Quota ``owner`` owns them all and lends them;
quota ``borrower`` owns none. The story:

1. ``gpu_borrower`` trains ``dags/scripts/train_mlp.py`` on all the GPUs, borrowed from ``owner``.
2. Once it has written a periodic checkpoint, ``gpu_owner`` asks for its GPUs back (priority 80).
   The executor reclaims them: the borrower's command gets SIGTERM, finishes its step, checkpoints
   and exits within its grace period; the task goes to up_for_reschedule, not failed.
3. The owner's job trains on the same GPUs; when it ends the borrower starts again, resumes from
   the checkpoint it wrote at SIGTERM and finishes.

The scheduler, dag-processor and api-server run on SQLite in a temporary AIRFLOW_HOME; the executor
finds the GPUs with ``nvidia-smi`` as in production. Afterwards the same training runs once more
without interruption, outside Airflow, and its final loss is compared with the resumed one.

It prints the timeline (reclaim decision, SIGTERM, checkpoint, exit, the owner's start, the resume)
and a line per check; it exits 1 when a check fails. ``--require-gpu`` also fails when there is no
``nvidia-smi`` or a run did not see a CUDA device; without it the story runs on one virtual GPU and
the CPU, to try the script where there is no GPU.

usage: python benchmarks/gpu_story.py [--require-gpu] [--steps 3000] [--hidden 2048] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_quota_provider.executors.config import discover_devices  # noqa: E402
from tests.integration_support import AirflowInstance, free_port, wait_for  # noqa: E402

TRAIN = Path(__file__).resolve().parents[1] / "dags" / "scripts" / "train_mlp.py"
GRACE_S = 30

QUOTAS = """
queues:
  - name: gpu
    capacity: {n}
    quotas:
      - {{name: owner, capacity: {n}, sharing: lend_and_borrow, grace_period_s: {grace}}}
      - {{name: borrower, capacity: 0, sharing: lend_and_borrow, grace_period_s: {grace}}}
"""

DAGS = '''
import pendulum
from airflow.sdk import DAG
from airflow_quota_provider.operators.training import QuotaTrainingOperator

for dag_id, quota, priority, args in [
    ("gpu_borrower", "borrower", 10, {borrower_args!r}),
    ("gpu_owner", "owner", 80, {owner_args!r}),
]:
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
        QuotaTrainingOperator(
            task_id="train",
            quota=quota,
            gpus={n},
            priority=priority,
            command="{python} {train} " + args + f" --events {events}/{{dag_id}}.jsonl",
            preemptible=quota == "borrower",
            max_preemptions=3,
            retries=0,
        )
'''


def train_args(args: argparse.Namespace, *, steps: int, seed: int) -> str:
    return (
        f"--steps {steps} --hidden {args.hidden} --batch-size {args.batch_size} --seed {seed}"
        f" --checkpoint-every {args.checkpoint_every} --step-sleep {args.step_sleep}"
    )


def task_logs(home: Path, chars: int = 4000) -> str:
    return "\n".join(f"{log}:\n{log.read_text(errors='replace')[-chars:]}" for log in sorted((home / "logs").rglob("*.log")))


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def __call__(self, name: str, ok: bool, detail: object = "") -> None:
        print(f"  [{'ok' if ok else 'FAILED'}] {name}" + (f": {detail}" if detail != "" else ""))
        if not ok:
            self.failed.append(name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--require-gpu", action="store_true", help="fail without nvidia-smi or CUDA")
    p.add_argument("--steps", type=int, default=3000, help="the borrower's training steps")
    p.add_argument("--owner-steps", type=int, default=1000)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--step-sleep", type=float, default=0.01)
    p.add_argument("--keep", action="store_true", help="keep the AIRFLOW_HOME")
    args = p.parse_args()

    devices, source = discover_devices("", 0)
    if source != "nvidia-smi":
        if args.require_gpu:
            print(f"no GPU: nvidia-smi listed none ({shutil.which('nvidia-smi') or 'not installed'})")
            return 1
        devices, source = ["0"], "one virtual GPU (no nvidia-smi)"
    n = len(devices)
    smi = shutil.which("nvidia-smi")
    if smi:
        print(subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip())
    print(f"{n} GPU(s) from {source}: {','.join(devices)}")

    home = Path(tempfile.mkdtemp(prefix="quota-gpu-story-"))
    events = home / "events"
    events.mkdir()
    dags = home / "dags"
    dags.mkdir()
    borrower_args = train_args(args, steps=args.steps, seed=7)
    (dags / "gpu_story.py").write_text(
        DAGS.format(
            n=n,
            python=sys.executable,
            train=TRAIN,
            events=events,
            borrower_args=borrower_args,
            owner_args=train_args(args, steps=args.owner_steps, seed=42),
        )
    )
    env = {"AIRFLOW__QUOTA__VIRTUAL_GPUS": "0" if source == "nvidia-smi" else "1"}
    airflow = AirflowInstance(
        home / "airflow",
        port=free_port(28700, 28799, also=50),
        quota_file=QUOTAS.format(n=n, grace=GRACE_S),
        dags_folder=dags,
        extra_env=env,
    )
    checks = Checks()
    try:
        began = time.time()
        airflow.start()
        run_b = airflow.trigger("gpu_borrower")
        borrower, owner = events / "gpu_borrower.jsonl", events / "gpu_owner.jsonl"

        def borrower_checkpointed() -> bool:
            if airflow.sql("SELECT 1 FROM dag_run WHERE run_id=? AND state='failed'", run_b):
                raise AssertionError(f"the borrower's run failed:\n{task_logs(airflow.home)}")
            return any(e["event"] == "checkpoint" for e in read_events(borrower))

        wait_for(
            borrower_checkpointed,
            "the borrower's first periodic checkpoint",
            timeout=600,
            on_timeout=lambda: airflow.tail("scheduler"),
        )
        run_a = airflow.trigger("gpu_owner")
        state_a = airflow.wait_run("gpu_owner", run_a, timeout=900)
        state_b = airflow.wait_run("gpu_borrower", run_b, timeout=900)
        wall = time.time() - began

        b, a = read_events(borrower), read_events(owner)
        by_pid: dict[int, list[dict]] = {}
        for e in b:
            by_pid.setdefault(e["pid"], []).append(e)
        runs = list(by_pid.values())
        first, last = runs[0], runs[-1]
        sigterm = next((e for e in first if e["event"] == "sigterm"), None)
        stop_ckpt = next((e for e in first if e["event"] == "checkpoint" and e.get("reason") == "sigterm"), None)
        first_exit = first[-1]
        resumed = last[0]
        owner_start = next(e for e in a if e["event"] == "start")
        ev = {kind: airflow.events(kind, dag_id="gpu_borrower") for kind in ("admitted", "preempted", "reclaimed", "forced")}
        owner_admitted = airflow.events("admitted", dag_id="gpu_owner")
        preempted_at = ev["preempted"][0]["at"] if ev["preempted"] else None
        ti = airflow.tis("gpu_borrower", run_b)["train"]
        count = airflow.sql("SELECT count FROM quota_preemption_count WHERE dag_id='gpu_borrower'")

        print(f"\nstory in {wall:.0f} s (Airflow start included); timeline from the reclaim decision:")
        if preempted_at is not None and sigterm and stop_ckpt:
            rows = [
                ("reclaim decided (quota_event preempted)", preempted_at),
                (f"SIGTERM seen by the command, at step {sigterm['step']}", sigterm["time"]),
                ("checkpoint written", stop_ckpt["time"]),
                (f"command exited with {first_exit.get('code')}", first_exit["time"]),
                (f"owner's command started on {owner_start.get('gpu_name')}", owner_start["time"]),
                (f"borrower resumed from step {resumed.get('start_step')}", resumed["time"]),
                ("borrower finished", last[-1]["time"]),
            ]
            for what, at in rows:
                print(f"  {at - preempted_at:+8.2f} s  {what}")
        print("\nchecks:")
        checks("both runs succeeded", (state_a, state_b) == ("success", "success"), (state_a, state_b))
        gpu_runs = [r[0] for r in runs] + [owner_start]
        if args.require_gpu:
            checks(
                "every run trained on a CUDA device",
                all(r.get("device") == "cuda" for r in gpu_runs),
                sorted({str(r.get("gpu_name")) for r in gpu_runs}),
            )
        admitted_devices = [e["devices"] for e in ev["admitted"]] + [e["devices"] for e in owner_admitted]
        checks(
            "each run saw exactly the GPUs it was admitted on (CUDA_VISIBLE_DEVICES)",
            [r.get("cuda_visible_devices") for r in gpu_runs] == admitted_devices,
            admitted_devices,
        )
        checks("the borrower was admitted on borrowed GPUs", bool(airflow.events("borrowed", dag_id="gpu_borrower")))
        checks("one reclaim, by the owner's job", len(ev["reclaimed"]) == 1 and len(ev["preempted"]) == 1)
        checks("the first run stopped on SIGTERM with a checkpoint", bool(sigterm and stop_ckpt) and first_exit.get("code") == 143)
        checks(
            "it exited within its grace period, not forced",
            not ev["forced"] and preempted_at is not None and first_exit["time"] - preempted_at < GRACE_S,
            f"{first_exit['time'] - preempted_at:.2f} s of {GRACE_S}" if preempted_at else "",
        )
        checks(
            "the owner started only after the borrower's command exited",
            owner_start["time"] >= first_exit["time"],
        )
        checks(
            "the second run resumed from the SIGTERM checkpoint (no step lost)",
            bool(stop_ckpt) and resumed.get("resume_from") == stop_ckpt["path"] and resumed.get("start_step") == stop_ckpt["step"],
            f"step {resumed.get('start_step')}",
        )
        checks("the preemption was counted once", [r["count"] for r in count] == [1] and resumed.get("preemption_count") == 1)
        checks("no retry was used (try_number 1)", (ti["state"], ti["try_number"]) == ("success", 1), dict(ti))

        # The same training without interruption, outside Airflow: the resumed run must end where it ends.
        ref_dir = home / "reference"
        ref_dir.mkdir()
        ref = subprocess.run(
            [sys.executable, str(TRAIN), *borrower_args.split(), "--events", str(ref_dir / "events.jsonl")],
            env={**os.environ, "QUOTA_CHECKPOINT_DIR": str(ref_dir), "CUDA_VISIBLE_DEVICES": ",".join(devices)},
            capture_output=True,
            text=True,
            cwd=home,
            check=False,
        )
        reference = read_events(ref_dir / "events.jsonl")
        ref_loss = reference[-1].get("loss") if reference and ref.returncode == 0 else None
        resumed_loss = last[-1].get("loss")
        checks(
            "the resumed run's final loss equals an uninterrupted run's",
            ref_loss is not None and resumed_loss is not None and abs(resumed_loss - ref_loss) <= 1e-4 * max(abs(ref_loss), 1e-12),
            f"resumed {resumed_loss!r}, uninterrupted {ref_loss!r}" + (f"\n{ref.stderr[-2000:]}" if ref.returncode else ""),
        )
    except Exception:
        print(f"scheduler log:\n{airflow.tail('scheduler')}")
        raise
    finally:
        airflow.stop()
        if args.keep or checks.failed:
            print(f"AIRFLOW_HOME kept: {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    print("\n" + ("all checks passed" if not checks.failed else f"{len(checks.failed)} check(s) failed"))
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
