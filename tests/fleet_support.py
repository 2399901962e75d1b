"""A real GPU fleet on this machine, for the fleet tests and ``benchmarks/fleet.py``.

PostgreSQL as Airflow's database (a database of its own per fleet), Redis as the Celery broker (a
Redis database of its own), an api-server, a dag-processor and a scheduler, and GPU hosts: each an
``airflow quota worker`` (QuotaExecutor with ``[quota] launcher = celery``) or, for a baseline, a
plain ``airflow celery worker`` (CeleryExecutor), with a log-server port and job directory of its own.
``scripts/test`` starts PostgreSQL and Redis, installing them where they are missing.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from airflow_quota_provider.executors.local_launcher import kill_tree
from tests.integration_support import QUOTA_EXECUTOR, VENV_BIN, AirflowInstance, free_port, wait_for

PG = "postgresql://postgres@127.0.0.1:5432"
CELERY_EXECUTOR = "CeleryExecutor"


def _admin(sql: str) -> None:
    import psycopg2

    con = psycopg2.connect(f"{PG}/postgres")
    con.autocommit = True
    try:
        with con.cursor() as cur:
            cur.execute(sql)
    finally:
        con.close()


class Fleet(AirflowInstance):
    """An Airflow on PostgreSQL with Celery GPU hosts."""

    def __init__(self, home: Path, database: str, *, gpus_per_host: int, **kw) -> None:
        self.database = database
        self.gpus_per_host = gpus_per_host
        super().__init__(home, database_url=f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}", **kw)
        self.workers: dict[str, subprocess.Popen] = {}
        self._worker_ports: dict[str, int] = {}
        self._worker_options: dict[str, list[str]] = {}
        """Host -> its ``airflow quota worker`` options beyond the fleet's own (kept for a restart)."""
        self._celery = None

    def worker_command(self, host: str) -> list[str]:
        if self.env["AIRFLOW__CORE__EXECUTOR"] == CELERY_EXECUTOR:
            return ["celery", "worker", "--queues", "default", "--concurrency", str(self.gpus_per_host),
                    "--celery-hostname", host]
        return ["quota", "worker", "--queues", "gpu-fleet", "--hostname", host, "--virtual-gpus", str(self.gpus_per_host),
                "--address", "127.0.0.1", *self._worker_options.get(host, ())]

    def start_worker(self, host: str) -> subprocess.Popen:
        """One GPU host with a log-server port and job directory of its own (with the options it was
        first started with, :meth:`start_workers`)."""
        self.start_workers([host])
        return self.workers[host]

    def start_workers(self, hosts: Iterable[str], options: Mapping[str, list[str]] | None = None) -> None:
        """GPU hosts started at once, each as :meth:`start_worker`; ``options``: host -> ``airflow quota
        worker`` options that replace the fleet's (``--queues``, ``--virtual-gpus``) or add to them
        (``--gpu-type``)."""
        self._worker_options.update(options or {})
        hosts = list(hosts)
        for host in hosts:
            port = self._worker_ports.setdefault(host, free_port(18600 + 10 * len(self._worker_ports), 18699))
            log = open(self.home / f"worker-{host}.log", "ab")
            env = {
                **self.env,
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(port),
                "AIRFLOW__QUOTA__STATE_DIR": str(self.home / f"host-{host}"),
            }
            self.workers[host] = subprocess.Popen(
                [str(VENV_BIN / "airflow"), *self.worker_command(host)],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.home, start_new_session=True,
            )
        for host in hosts:
            wait_for(lambda: self._worker_ready(host), f"worker {host} to take tasks", timeout=120,
                     on_timeout=lambda: self.tail(f"worker-{host}"))

    def _worker_ready(self, host: str) -> bool:
        proc = self.workers[host]
        if proc.poll() is not None:
            raise AssertionError(f"worker {host} exited ({proc.returncode}):\n{self.tail(f'worker-{host}')}")
        return bool(self._broker().control.ping(destination=[f"celery@{host}"], timeout=1.0))

    def _broker(self):
        """A bare Celery client on the fleet's broker, for remote-control pings."""
        from celery import Celery

        if self._celery is None:
            self._celery = Celery(broker=self.env["AIRFLOW__CELERY__BROKER_URL"])
        return self._celery

    def kill_host(self, host: str) -> None:
        """The host dies: its worker and every process under it get SIGKILL at once."""
        proc = self.workers.pop(host)
        kill_tree(proc.pid)
        proc.wait(timeout=30)

    def stop(self) -> None:
        # All hosts at once: a Celery worker's warm shutdown waits for its tasks, and one after the
        # other that cost CI up to a minute per fleet.
        workers = [self.workers.pop(host) for host in list(self.workers)]
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in workers:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            kill_tree(proc.pid)
        super().stop()

    def quota(self, *args: str) -> str:
        return self.airflow("quota", *args).stdout


@contextlib.contextmanager
def running_fleet(
    root: Path,
    *,
    quota_file: str,
    dags_folder: Path,
    hosts: tuple[str, ...],
    gpus_per_host: int,
    port: int,
    redis_db: int,
    executor: str = QUOTA_EXECUTOR,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Fleet]:
    """Start a fleet in a fresh database and Redis database; stop it and drop them afterwards."""
    import redis

    database = f"quota_fleet_{secrets.token_hex(4)}"
    _admin(f"CREATE DATABASE {database}")
    redis.Redis(host="127.0.0.1", port=6379, db=redis_db).flushdb()
    instance = Fleet(
        root,
        database,
        gpus_per_host=gpus_per_host,
        port=port,
        quota_file=quota_file,
        dags_folder=dags_folder,
        executor=executor,
        extra_env={
            "AIRFLOW__QUOTA__LAUNCHER": "celery",
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:6379/{redis_db}",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://postgres@127.0.0.1:5432/{database}",
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "86400",
            "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
            **(extra_env or {}),
        },
    )
    try:
        instance.start()
        instance.start_workers(hosts)
        yield instance
    finally:
        instance.stop()
        _admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
