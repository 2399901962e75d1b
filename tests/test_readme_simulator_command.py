"""The README's simulator command runs on a fresh checkout: the trace it names is in the repository
(examples/traces/, with its licence notice beside it), and the command replays it."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _readme_command() -> list[str]:
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(python -m airflow_quota_provider\.simulation run .*?)```", readme, re.S)
    assert block, "README: the simulator's command"
    return shlex.split(block[1].replace("\\\n", " "))


def test_the_readme_s_simulator_command_replays_the_trace_sample_the_repository_ships(tmp_path):
    argv = _readme_command()
    trace = REPO / argv[argv.index("--trace") + 1]
    assert trace.is_file(), f"the README's trace {trace} is not in the repository"
    assert (trace.parent / "LICENSE-itp_elasticflow.txt").is_file(), "the trace's licence notice travels with it"
    # Run from the repository root as the README says, its outputs in a scratch directory.
    for option in ("--json", "--plot"):
        argv[argv.index(option) + 1] = str(tmp_path / argv[argv.index(option) + 1])
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out.json").read_text())
    assert (report["workload"]["jobs"], report["workload"]["teams"]) == (319, 10)
    assert (tmp_path / "out.png").stat().st_size > 0
