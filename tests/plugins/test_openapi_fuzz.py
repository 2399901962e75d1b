"""Schemathesis against the plugin's own OpenAPI document (``/quota/api/openapi.json``) on the shared
api-server (tests/quota_api_support.py), authenticated as ``op`` (pool edit rights): every operation
gets generated valid and invalid input (the examples, coverage and fuzzing phases, every check) and
must answer without a server error and within its schema (status codes, content types, bodies).

Bounded so it runs in about a minute on two cores: ``MAX_EXAMPLES`` per operation and phase, one
worker, a fixed seed (the same cases on every run; ``QUOTA_FUZZ_SEED`` and ``QUOTA_FUZZ_MAX_EXAMPLES``
explore others). Schemathesis runs as its CLI, ``schemathesis run`` (its pytest plugin does not run
under pytest 9.2), and its report is the failure message. PATCHes are kept off other tests' rows by
:mod:`tests.plugins.fuzz_hooks`; the running job this test seeds is finished afterwards, and its
waiting ones are in team-a and team-b, whose figures no later test reads.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.integration_support import REPO

MAX_EXAMPLES = int(os.environ.get("QUOTA_FUZZ_MAX_EXAMPLES", "250"))
SEED = int(os.environ.get("QUOTA_FUZZ_SEED", "13"))
USER = "op"
OWN_JOBS = (
    {"case": "fuzz_pending_capped", "quota": "team-a", "priority": 10},
    {"case": "fuzz_pending_uncapped", "quota": "team-b", "priority": 10},
    {"case": "fuzz_running", "quota": "team-lab", "gpus": 1, "state": "running", "devices": ["9"]},
    {"case": "fuzz_finished", "quota": "team-b", "state": "finished"},
)
# 400 is a documented answer to input the schema allows and the quota file refuses: a priority above
# the quota's max_priority, an unknown state or event kind.
CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "400", "404", "409"]
"""


def test_schemathesis_finds_no_server_error_and_no_answer_outside_the_schema(server, tmp_path):
    server.baseline()
    last_foreign = max(row["id"] for row in server.instance.sql("SELECT id FROM quota_job"))
    seeded = server.seed(*OWN_JOBS)
    own = sorted(seeded.values())
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "SCHEMATHESIS_HOOKS": "tests.plugins.fuzz_hooks",
        "QUOTA_FUZZ_OWN_JOBS": ",".join(map(str, own)),
        "QUOTA_FUZZ_LAST_FOREIGN": str(last_foreign),
    }
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(tmp_path / "schemathesis.toml"), "--no-color",
        "run", f"{server.base}/quota/api/openapi.json",
        "--url", f"{server.base}/quota",
        "--header", f"Authorization: Bearer {server.token(USER)}",
        "--checks", "all",
        "--phases", "examples,coverage,fuzzing",
        "--max-examples", str(MAX_EXAMPLES),
        "--seed", str(SEED),
        "--workers", "1",
        "--generation-database", "none",
        "--report-dir", str(tmp_path / "report"),
    ]  # fmt: skip
    try:
        result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    finally:
        server.finish(seeded["fuzz_running"])  # team-lab's GPUs are the sensor and trigger tests' to fill
    assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-4000:]
