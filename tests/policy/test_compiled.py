"""setup.py's compiled policy and simulator modules decide exactly as their Python source does,
and a compiled module older than its source is refused, not silently run (airflow_quota_provider/_compiled.py)."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from airflow_quota_provider._compiled import stale
from tests.integration_support import REPO

SETUP_PY = REPO / "setup.py"
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


def _source_only(tmp_path):
    shutil.copytree(REPO / "airflow_quota_provider", tmp_path / "airflow_quota_provider",
                    ignore=shutil.ignore_patterns("*.so", "*.c", "*.pxd", "__pycache__"))
    return tmp_path


NO_COMPILER = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) is None


@pytest.mark.skipif(os.environ.get("AIRFLOW_QUOTA_PURE_PYTHON") == "1", reason="asked for plain Python")
@pytest.mark.skipif(NO_COMPILER, reason="no C compiler: setup.py left the policy as plain Python")
def test_compiled_modules_decide_exactly_as_their_source(tmp_path):
    compiled_files, compiled = _replay(REPO, 10000)
    assert all(path.endswith(SUFFIX) for path in compiled_files), \
        f"not compiled: {compiled_files} (scripts/bootstrap runs `python setup.py build_ext --inplace`)"
    source_files, source = _replay(_source_only(tmp_path), 10000)
    assert all(path.endswith(".py") for path in source_files), source_files
    assert compiled == source
    decisions, preemptions, _ = compiled.split()
    assert int(decisions) > 2000 and int(preemptions) > 50  # the replay did run, and preempted


def test_a_source_newer_than_its_compiled_module_is_stale(tmp_path):
    package = tmp_path / "airflow_quota_provider" / "policy"
    package.mkdir(parents=True)
    (tmp_path / "setup.py").write_text("")
    source, compiled = package / "backlog.py", package / f"backlog{SUFFIX}"
    compiled.write_bytes(b"")
    source.write_text("")
    os.utime(compiled, (1_000_000, 1_000_000))
    assert stale(package) == [source]
    os.utime(compiled, None)
    os.utime(source, (1_000_000, 1_000_000))
    assert stale(package) == []
    declarations = package / "backlog.pxd"  # the classes Cython compiles as extension types
    declarations.write_text("")
    os.utime(compiled, (1_000_000, 1_000_000))
    assert stale(package) == [declarations]


def test_an_installed_package_is_not_checked(tmp_path):
    """No setup.py above it: pip installed it, compiled or not, and the two cannot drift apart."""
    package = tmp_path / "site-packages" / "airflow_quota_provider" / "policy"
    package.mkdir(parents=True)
    (package / f"backlog{SUFFIX}").write_bytes(b"")
    os.utime(package / f"backlog{SUFFIX}", (1_000_000, 1_000_000))
    (package / "backlog.py").write_text("")
    assert stale(package) == []


def test_importing_the_policy_with_a_stale_compiled_module_fails_with_the_command(tmp_path):
    root = _source_only(tmp_path)
    shutil.copy(SETUP_PY, root / "setup.py")
    compiled = root / "airflow_quota_provider" / "policy" / f"backlog{SUFFIX}"
    compiled.write_bytes(b"")
    os.utime(compiled, (1_000_000, 1_000_000))
    run = subprocess.run([sys.executable, "-c", "import airflow_quota_provider.policy"], cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True)
    assert run.returncode == 1
    assert "ImportError: backlog.py in" in run.stderr and "changed since it was compiled" in run.stderr
    assert "python setup.py build_ext --inplace" in run.stderr
