"""A throw-away Airflow 3.3 installation for task-side tests: SQLite, its own AIRFLOW_HOME.

Tasks run through ``dag.test()`` in a separate Python process (``dag_test_driver.py``). Each
attempt runs in a real task process that the Task SDK's production supervisor (``supervise_task``)
forks, over the Execution API served in-process on the DB, so the operator's ``execute`` and
``on_kill`` run as under an executor and its commands are real processes. Each run reports the task
instance's state and ``try_number`` from the metadata DB after every attempt.

The provider is registered the way ``pip install`` registers it: a ``.dist-info`` directory with
its ``apache_airflow_provider`` entry point on ``PYTHONPATH``, so ``@task.quota`` resolves through
Airflow's ProvidersManager.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from airflow_quota_provider.protocol import PreemptionNotice, write_notice

# Importing Airflow in the pytest process (to build operators) must not touch ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="quota-tests-airflow-home-"))

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("dag_test_driver.py")
TRAIN_SCRIPT = REPO / "dags" / "scripts" / "train_mlp.py"
QUOTA_EXECUTOR = "quota:airflow_quota_provider.executors.quota_executor.QuotaExecutor"


@dataclass
class AirflowHome:
    root: Path
    dags: Path
    env: dict[str, str]

    def write_dag(self, dag_id: str, source: str) -> Path:
        path = self.dags / f"{dag_id}.py"
        path.write_text(textwrap.dedent(source))
        return path

    def start_dag_test(
        self, dag_id: str, extra_env: dict[str, str] | None = None, *, supervise: bool = True
    ) -> DagTestRun:
        """Start ``dag.test()`` for ``dag_id``. ``supervise``: each attempt in a real task process forked
        by the Task SDK supervisor (as under an executor); else in the driver process (faster)."""
        out = self.root / f"{dag_id}.result.json"
        log = self.root / f"{dag_id}.log"
        out.unlink(missing_ok=True)
        with log.open("wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, str(DRIVER), str(self.dags / f"{dag_id}.py"), dag_id, str(out)],
                env={**self.env, "DAG_TEST_SUPERVISE": "1" if supervise else "0", **(extra_env or {})},
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.root,
            )
        return DagTestRun(proc=proc, out=out, log=log)


@dataclass
class DagTestRun:
    proc: subprocess.Popen
    out: Path
    log: Path

    def wait(self, timeout: float = 150) -> dict:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"dag.test() did not finish; log:\n{self.output()[-6000:]}") from None
        assert self.out.exists(), f"driver wrote no result (rc={self.proc.returncode}):\n{self.output()[-6000:]}"
        return json.loads(self.out.read_text())

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def wait_for(predicate, what: str, timeout: float = 90, run: DagTestRun | None = None):
    """Poll until ``predicate()`` is truthy; a safety net, not a timing assertion."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := predicate():
            return value
        if run is not None and run.proc.poll() is not None:
            raise AssertionError(f"dag.test() ended before {what}:\n{run.output()[-6000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f":\n{run.output()[-6000:]}" if run else ""))


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_preempt_file(path: Path, *, reason: str, preemptor: str, deadline: float) -> None:
    """Deliver a notice the way the executor's launcher does."""
    write_notice(path, PreemptionNotice(reason, preemptor, deadline))


def _register_provider(site: Path) -> None:
    dist = site / "airflow_quota_provider-0.1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: airflow-quota-provider\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[apache_airflow_provider]\n"
        "provider_info = airflow_quota_provider.get_provider_info:get_provider_info\n"
    )


def make_airflow_home(root: Path, *, migrate: bool = True) -> AirflowHome:
    """Create AIRFLOW_HOME under ``root`` and (unless ``migrate=False``) run ``airflow db migrate`` (~10 s)."""
    dags = root / "dags"
    dags.mkdir(parents=True)
    site = root / "site"
    _register_provider(site)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "QUOTA_")) and k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")
    }
    env = {
        **base,
        "AIRFLOW_HOME": str(root),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": f"LocalExecutor,{QUOTA_EXECUTOR}",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{root / 'airflow.db'}",
        "AIRFLOW__QUOTA__STATE_DIR": str(root / "quota"),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    # Migrate without the provider registered: its tables belong to the executor's tests.
    if migrate:
        subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            env={**env, "PYTHONPATH": str(REPO)},
            check=True,
            capture_output=True,
            timeout=240,
        )
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(site)])
    return AirflowHome(root=root, dags=dags, env=env)
