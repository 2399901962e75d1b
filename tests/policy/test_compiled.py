"""The optional compiled build (setup.py with AIRFLOW_QUOTA_COMPILE=1, made outside the source tree by
scripts/build-compiled) decides exactly as the Python source that every checkout runs."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from tests.integration_support import REPO

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]

# A replay that takes the policy's roads: Kueue's shape (borrowing, reclaim, preemption within a
# quota) with "spare jobs finishing within" (runtimes known, with noise), checkpoints, with and
# without placement on hosts; now and then the decision is also explained and the waiting jobs'
# starts are estimated (the forecast's engine). Hundreds of preemptions each way.
REPLAY = textwrap.dedent("""
    import hashlib, sys
    from airflow_quota_provider.policy import decide
    from airflow_quota_provider.simulation.forecast import estimate_starts
    from airflow_quota_provider.simulation.engine import Simulator
    from airflow_quota_provider.simulation.policies import policy_setup
    from airflow_quota_provider.simulation.runner import uniform_fleet
    from airflow_quota_provider.simulation.workload import kueue_baseline
    import airflow_quota_provider.policy.cycle as cycle, airflow_quota_provider.simulation.engine as engine

    quota_file, jobs = kueue_baseline(spare_finishing_within_s=0.3)
    jobs = sorted(jobs, key=lambda j: j.submit_time_s)[:JOBS]
    digest = hashlib.sha256()
    calls = preemptions = 0

    def observed(state, now):
        global calls
        calls += 1
        decision = decide(state, now, explain=calls % 97 == 0)
        digest.update(repr((now, decision)).encode())
        if calls % 97 == 0:
            digest.update(repr(sorted(estimate_starts(state, now).items())).encode())
        return decision

    for fleet in (None, uniform_fleet(quota_file, 6, 20)):
        result = Simulator(quota_file, policy_setup(quota_file, "quota"), jobs, checkpoint_interval_s=0.3,
                           decide=observed, hosts=fleet, runtime_noise=0.5).run()
        digest.update(repr([(j.trace.id, j.status, j.first_start, j.end, j.preemptions, j.lost) for j in result.jobs]).encode())
        preemptions += sum(j.preemptions for j in result.jobs)
    print(cycle.__file__, engine.__file__, calls, preemptions, digest.hexdigest())
""")


def _replay(root, jobs: int) -> tuple[list[str], str]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
    out = subprocess.run([sys.executable, "-c", REPLAY.replace("JOBS", str(jobs))], cwd=root, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return out[:2], " ".join(out[2:])


NO_COMPILER = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) is None


def test_the_checkout_runs_its_python_source():
    """Nothing compiled in the tree: an edit runs at once (scripts/bootstrap deletes what an older
    checkout compiled in place)."""
    files, _ = _replay(REPO, 50)
    assert all(path.endswith(".py") for path in files), files


@pytest.mark.skipif(NO_COMPILER, reason="no C compiler: the compiled build cannot be made here")
def test_compiled_modules_decide_exactly_as_their_source(tmp_path):
    built = tmp_path / "compiled"
    # Unoptimised C: what could decide differently is Cython's translation (C integer types, the .pxd
    # declarations), not gcc's optimiser, and -O0 builds in a sixth of the time (10 s, not 62 s).
    subprocess.run([str(REPO / "scripts" / "build-compiled"), str(built)], check=True, capture_output=True,
                   env={**os.environ, "PYTHON": sys.executable, "CFLAGS": "-O0"})
    compiled_files, compiled = _replay(built, 10000)
    assert all(path.endswith(SUFFIX) for path in compiled_files), f"not compiled: {compiled_files}"
    source_files, source = _replay(REPO, 10000)
    assert all(path.endswith(".py") for path in source_files), source_files
    assert compiled == source
    decisions, preemptions, _ = compiled.split()
    assert int(decisions) > 2000 and int(preemptions) > 50  # the replay did run, and preempted
