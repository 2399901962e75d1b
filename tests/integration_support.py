"""A real Airflow 3.3 for integration tests: api-server, dag-processor and scheduler on SQLite.

Each :class:`AirflowInstance` lives in its own temporary AIRFLOW_HOME with QuotaExecutor as the
default executor (alias ``quota``), real task processes and no mock of Airflow. The provider is
registered the way ``pip install`` registers it: a ``.dist-info`` directory with its
``apache_airflow_provider`` entry point on ``PYTHONPATH``.

Tests talk to it through the public REST API (``SIMPLE_AUTH_MANAGER_ALL_ADMINS``), the ``airflow``
CLI, and read-only SQL on its database. Processes run in their own sessions and are stopped by
process group; task processes are found through QuotaExecutor's pid files and stopped too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
QUOTA_EXECUTOR = "quota:airflow_quota_provider.executors.quota_executor.QuotaExecutor"
LOCAL_EXECUTOR = "LocalExecutor"


def _provider_installed() -> bool:
    from importlib.metadata import entry_points

    return any(
        ep.value.startswith("airflow_quota_provider.") for ep in entry_points(group="apache_airflow_provider")
    )


def provider_shim(root: Path) -> Path:
    """A site dir that registers the provider's entry point (unless it is pip-installed already), and
    makes every process of the test print all its threads' stacks on SIGQUIT (:meth:`AirflowInstance.stacks`)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "sitecustomize.py").write_text(
        "import faulthandler, signal\nfaulthandler.register(signal.SIGQUIT, all_threads=True)\n"
    )
    if _provider_installed():
        return root
    dist = root / "airflow_quota_provider-0.1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: airflow-quota-provider\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[apache_airflow_provider]\nprovider_info = airflow_quota_provider.get_provider_info:get_provider_info\n"
    )
    return root


def port_shift() -> int:
    """What :func:`free_port` adds to its range in this pytest-xdist worker."""
    return 1000 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def free_port(first: int, last: int, *, also: int = 0) -> int:
    """A port in [first, last] that is free now (and ``port + also`` too, when ``also``), shifted by
    :func:`port_shift` per pytest-xdist worker: a port found free is taken only when a server starts,
    seconds later."""
    shift = port_shift()
    for port in range(first + shift, last + shift + 1):
        wanted = [port] + ([port + also] if also else [])
        try:
            for p in wanted:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port in {first + shift}-{last + shift}")


def wait_for(predicate, what: str, timeout: float = 240.0, interval: float = 1.0, on_timeout=None):
    """Poll until ``predicate()`` is truthy and return it; a safety net, not a timing assertion."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            extra = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out waiting for {what}\n{extra}")
        time.sleep(interval)


class AirflowInstance:
    """One Airflow installation with its processes."""

    def __init__(
        self,
        home: Path,
        *,
        port: int,
        quota_file: str,
        dags_folder: Path,
        executor: str = QUOTA_EXECUTOR,
        extra_env: dict[str, str] | None = None,
        database_url: str | None = None,
    ) -> None:
        """``database_url``: a PostgreSQL URL (``postgresql+psycopg2://...``); default SQLite in ``home``."""
        self.home = home
        self.database_url = database_url
        self.port = port
        self.home.mkdir(parents=True, exist_ok=True)
        self.quota_path = home / "quotas.yaml"
        self.quota_path.write_text(textwrap.dedent(quota_file))
        self.records = home / "records"
        self.records.mkdir(exist_ok=True)
        shim = provider_shim(home / "site")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")},
            "AIRFLOW_HOME": str(home),
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)]),
            "AIRFLOW__CORE__EXECUTOR": executor,
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__PARALLELISM": "256",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url or f"sqlite:///{home}/airflow.db",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "5",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(port + 50),
            "AIRFLOW__QUOTA__QUOTA_FILE": str(self.quota_path),
            "QUOTA_TEST_RECORDS": str(self.records),
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self._orphan_groups: list[int] = []
        self.token: str | None = None  # a JWT for api(), where not every user is admin

    # ----------------------------------------------------------------------------- processes

    def airflow(self, *args: str, check: bool = True, timeout: float = 120, env: dict | None = None):
        """Run the ``airflow`` CLI in this home; returns the CompletedProcess."""
        result = subprocess.run(
            [str(VENV_BIN / "airflow"), *args],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.home,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def start_process(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """``airflow *args`` as process ``name`` (log ``<name>.log``), with ``env`` over this home's."""
        log = open(self.home / f"{name}.log", "ab")
        proc = subprocess.Popen(
            [str(VENV_BIN / "airflow"), *args],
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.home,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    @contextlib.contextmanager
    def restarting(self, *names: str):
        """Start again any of processes ``names`` that exits meanwhile (with its arguments, in this
        home's environment), as a fleet's supervisor does (``restart: always`` in docker/compose.yaml)."""
        done = threading.Event()

        def watch() -> None:
            while not done.wait(1.0):
                for name in names:
                    proc = self.procs.get(name)
                    if proc is not None and proc.poll() is not None:
                        self.start_process(name, *proc.args[1:])

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()

    def start(self) -> AirflowInstance:
        self.airflow("db", "migrate")
        self.start_process("api-server", "api-server", "--port", str(self.port), "--host", "127.0.0.1")
        self.start_process("dag-processor", "dag-processor")
        self.start_scheduler()
        wait_for(self._api_up, "the api-server", timeout=120, on_timeout=lambda: self.tail("api-server"))
        return self

    def start_scheduler(self) -> subprocess.Popen:
        return self.start_process("scheduler", "scheduler")

    def kill_scheduler(self, sig: int = signal.SIGKILL) -> None:
        """Signal only the scheduler process itself (not its session: tasks run in their own)."""
        proc = self.procs.pop("scheduler")
        proc.send_signal(sig)
        proc.wait(timeout=60)
        self._orphan_groups.append(proc.pid)  # its log server lives on, as after a real crash

    def _api_up(self) -> bool:
        api = self.procs.get("api-server")
        if api is not None and api.poll() is not None:
            raise AssertionError(f"the api-server exited ({api.returncode}):\n{self.tail('api-server')}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v2/monitor/health", timeout=5):
                return True
        except (urllib.error.URLError, OSError):
            return False

    def task_pids(self) -> list[int]:
        pids = []
        for pid_file in (self.home / "quota" / "jobs").glob("*/pid"):
            try:
                pids.append(int(json.loads(pid_file.read_text())["pid"]))
            except (OSError, ValueError, KeyError):
                pass
        return pids

    def stop(self) -> None:
        for proc in self.procs.values():
            _kill_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid, signal.SIGKILL)
                proc.wait()
        for pid in self.task_pids() + self._orphan_groups:
            _kill_group(pid, signal.SIGKILL)
        self.procs.clear()

    def stacks(self, *names: str) -> str:
        """The logs of processes ``names`` after each printed its threads' stacks: where a hung one
        waits (for a wait that timed out; a process that is gone is only tailed)."""
        for name in names:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGQUIT)
        time.sleep(2)
        return "".join(f"\n--- {name} ({'running' if name in self.procs and self.procs[name].poll() is None else 'gone'}):\n"
                       f"{self.tail(name, chars=20000)}" for name in names)

    def tail(self, name: str, chars: int = 6000) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    # ------------------------------------------------------------------------------------ REST

    def api(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/v2{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {self.token}"} if self.token else {})},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"null")

    def wait_dag(self, dag_id: str, timeout: float = 120) -> None:
        wait_for(
            lambda: self.sql("SELECT 1 FROM dag WHERE dag_id=? AND NOT is_stale", dag_id),
            f"DAG {dag_id} to be parsed",
            timeout=timeout,
            on_timeout=lambda: self.tail("dag-processor"),
        )

    def trigger(self, dag_id: str, conf: dict | None = None, run_id: str | None = None) -> str:
        self.wait_dag(dag_id)
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        return self.api("POST", f"/dags/{dag_id}/dagRuns", body)["dag_run_id"]

    # ------------------------------------------------------------------------------------- SQL

    def sql(self, query: str, *params: Any) -> list[sqlite3.Row]:
        """Rows of a read-only query (``?`` placeholders) as mappings, on SQLite or PostgreSQL."""
        if self.database_url:
            import psycopg2
            import psycopg2.extras

            con = psycopg2.connect(self.database_url.replace("postgresql+psycopg2://", "postgresql://"))
            try:
                with con.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
                    cur.execute(query.replace("?", "%s"), params)
                    return cur.fetchall()
            finally:
                con.close()
        con = sqlite3.connect(f"file:{self.home}/airflow.db?mode=ro", uri=True, timeout=30)
        con.row_factory = sqlite3.Row
        try:
            return con.execute(query, params).fetchall()
        finally:
            con.close()

    def tis(self, dag_id: str, run_id: str) -> dict[str, sqlite3.Row]:
        rows = self.sql(
            "SELECT task_id, map_index, state, try_number, max_tries FROM task_instance WHERE dag_id=? AND run_id=?",
            dag_id,
            run_id,
        )
        return {r["task_id"] if r["map_index"] < 0 else f"{r['task_id']}[{r['map_index']}]": r for r in rows}

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 480) -> str:
        """Wait until the DAG run is finished; returns its state."""
        rows = wait_for(
            lambda: self.sql(
                "SELECT state FROM dag_run WHERE dag_id=? AND run_id=? AND state IN ('success','failed')",
                dag_id,
                run_id,
            ),
            f"run {dag_id}/{run_id} to finish",
            timeout=timeout,
            interval=2,
            on_timeout=lambda: f"{self.unfinished(dag_id, run_id)}\n{self.tail('scheduler')}",
        )
        return rows[0]["state"]

    def unfinished(self, dag_id: str, run_id: str) -> str:
        """The run's task instances that have not ended, with their job rows and events: what a
        timeout needs to say where a task is stuck."""
        lines = []
        for ti in self.sql(
            "SELECT task_id, map_index, state, try_number, queued_by_job_id FROM task_instance "
            "WHERE dag_id=? AND run_id=? AND state NOT IN ('success', 'failed', 'skipped')", dag_id, run_id
        ):
            lines.append(f"TI {dict(ti)}")
            where = "dag_id=? AND run_id=? AND task_id=? AND map_index=?"
            args = (dag_id, run_id, ti["task_id"], ti["map_index"])
            lines += [f"  job {dict(j)}" for j in self.sql(
                f"SELECT id, try_number, state, report, quota, host, handle, pending_reason, started_at, finished_at, "
                f"workload IS NOT NULL AS has_workload FROM quota_job WHERE {where}", *args)]
            lines += [f"  event {e['id']} {e['kind']} {e['message']}"
                      for e in self.sql(f"SELECT * FROM quota_event WHERE {where} ORDER BY id", *args)]
        return "\n".join(lines) or "every task instance ended"

    def events(self, kind: str | None = None, dag_id: str | None = None) -> list[sqlite3.Row]:
        query = "SELECT * FROM quota_event WHERE 1=1"
        params: list[Any] = []
        if kind:
            query += " AND kind=?"
            params.append(kind)
        if dag_id:
            query += " AND dag_id=?"
            params.append(dag_id)
        return self.sql(query + " ORDER BY id", *params)

    def task_records(self) -> list[dict]:
        """Lines the test tasks wrote (``QUOTA_TEST_RECORDS/*.jsonl``)."""
        out = []
        for path in sorted(self.records.glob("*.jsonl")):
            out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
        return sorted(out, key=lambda r: r["t"])


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
