"""One real Airflow api-server with the quota plugin, shared by the plugin, sensor and trigger tests.

It runs on a temporary SQLite AIRFLOW_HOME (``airflow db migrate`` creates Airflow's and the quota
tables) with SimpleAuthManager users of three roles, and no scheduler: the tests seed job rows with
the models' own functions (:mod:`tests.plugins.seed`, run in the instance's environment) and read
them back through the REST API, the UI page and the sensor's trigger.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.integration_support import REPO, AirflowInstance, wait_for

PORT = 18210
PASSWORDS = {"admin": "admin-pw-1", "op": "op-pw-1", "viewer": "viewer-pw-1"}

QUOTAS = """
queues:
  - name: gpu-fleet
    capacity: 8
    quotas:
      - {name: team-a, capacity: 4, max_priority: 100}
      - {name: team-b, capacity: 4, sharing: lend_and_borrow, borrow_limit: 4}
  - name: lab
    capacity: 2
    quotas:
      - {name: team-lab, capacity: 2, sharing: reserve}
"""

REASON_BLOCKED = "quota team-a full: 3/4 GPUs in use or lent; 1 lendable GPU in use by team-b at priority 10 < 50"
REASON_BEHIND = "behind 1 job of quota team-a that comes first (priority 50 > 20)"

BASELINE = (
    {"case": "team_b_borrower_running", "quota": "team-b", "gpus": 5, "priority": 10, "state": "running",
     "devices": ["0", "1", "2", "3", "4"]},
    {"case": "team_a_running", "quota": "team-a", "gpus": 2, "priority": 50, "state": "running", "devices": ["5", "6"]},
    {"case": "team_a_pending_blocked", "quota": "team-a", "gpus": 2, "priority": 50, "position": 1,
     "reason": REASON_BLOCKED, "waited_s": 95, "starts_in_s": 730},
    {"case": "team_a_pending_behind", "quota": "team-a", "gpus": 1, "priority": 20, "position": 2,
     "reason": REASON_BEHIND, "waited_s": 40},
    {"case": "team_b_preempted_earlier", "quota": "team-b", "gpus": 1, "priority": 5, "state": "finished",
     "preemptions": 1, "preempted_by": "team_a_running", "preempt_reason": "reclaim"},
)
"""Queue gpu-fleet: team-b borrows 1 GPU that team-a lends; team-a has two waiting jobs."""

_shared: dict[str, QuotaApiServer] = {}


class QuotaApiServer:
    """The running api-server: HTTP helpers with per-user tokens, and seeding."""

    def __init__(self, instance: AirflowInstance) -> None:
        self.instance = instance
        self.base = f"http://127.0.0.1:{PORT}"
        self._tokens: dict[str, str] = {}
        self._baseline: dict[str, int] | None = None

    def baseline(self) -> dict[str, int]:
        """The :data:`BASELINE` jobs, seeded once per test process; case name -> job id."""
        if self._baseline is None:
            self._baseline = self.seed(*BASELINE)
        return self._baseline

    def token(self, user: str) -> str:
        if user not in self._tokens:
            status, body = self.request("POST", "/auth/token", {"username": user, "password": PASSWORDS[user]})
            assert status == 201, (status, body)
            self._tokens[user] = body["access_token"]
        return self._tokens[user]

    def request(self, method: str, path: str, body: Any = None, *, user: str | None = None) -> tuple[int, Any]:
        """(status, parsed JSON body); ``user=None`` sends no credentials."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if user:
            headers["Authorization"] = f"Bearer {self.token(user)}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw, status = resp.read(), resp.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        try:
            return status, json.loads(raw or b"null")
        except ValueError:
            return status, raw.decode(errors="replace")

    def seed(self, *cases: dict) -> dict[str, int]:
        """Create job rows (see :mod:`tests.plugins.seed`); returns case name -> job id."""
        return self._seed_script(list(cases))

    def finish(self, job_id: int) -> None:
        """End a running job as the executor does (devices freed, state finished)."""
        self._seed_script({"finish": job_id})

    def _seed_script(self, payload: Any) -> Any:
        result = subprocess.run(
            [sys.executable, "-m", "tests.plugins.seed"],
            input=json.dumps(payload),
            env=self.instance.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        return json.loads(result.stdout.strip().splitlines()[-1])


def shared_server(request: pytest.FixtureRequest) -> QuotaApiServer:
    """Start the api-server once per test process, whichever test directory asks first."""
    if "server" not in _shared:
        home = request.config._tmp_path_factory.mktemp("quota-api")  # type: ignore[attr-defined]
        instance = AirflowInstance(
            home,
            port=PORT,
            quota_file=QUOTAS,
            dags_folder=home / "dags",
            extra_env={
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,op:op,viewer:viewer",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
                # Provider plugins load only with eager provider discovery (or an airflow.plugins
                # entry point); see docs/ui.md.
                "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False",
            },
        )
        (home / "dags").mkdir(exist_ok=True)
        (home / "passwords.json").write_text(json.dumps(PASSWORDS))
        request.config.add_cleanup(instance.stop)
        instance.airflow("db", "migrate", timeout=180)
        instance.start_process("api-server", "api-server", "--port", str(PORT), "--host", "127.0.0.1")
        wait_for(instance._api_up, "the api-server", timeout=150, on_timeout=lambda: instance.tail("api-server"))
        _shared["server"] = QuotaApiServer(instance)
    return _shared["server"]


async def first_event_after(trigger, while_waiting, *, idle_s: float = 1.0):
    """Run ``trigger`` for ``idle_s`` seconds (several polls), check that it has not fired, call
    ``while_waiting()`` (in a thread), and return the trigger's first event."""
    import asyncio

    pending = asyncio.ensure_future(trigger.run().__anext__())
    await asyncio.sleep(idle_s)
    assert not pending.done(), f"fired early: {pending.result() if pending.done() else ''}"
    await asyncio.to_thread(while_waiting)
    return await asyncio.wait_for(pending, 60)
