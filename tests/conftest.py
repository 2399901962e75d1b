"""Test-wide settings: hypothesis runs 500 examples per property in CI (HYPOTHESIS_PROFILE=ci), and
the groups that let scripts/test run the suite in two processes (pytest-xdist)."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

SERVICES = (
    "tests/containers/",
    "tests/faults/",
    "tests/fleet/",
    "tests/executors/test_pool_sync.py",
    "tests/models/test_coordination.py",
    "tests/test_metrics.py",
)
"""Tests that use the machine's PostgreSQL and Redis: the fault tests restart both, so they all run in
one process, one after the other."""

SHARED = {
    "tests/executors/": "airflow",
    "tests/plugins/": "api-server",
    "tests/sensors/": "api-server",
    "tests/triggers/": "api-server",
}
"""Directories whose tests share one Airflow per process (a session fixture; the api-server's port is
fixed): each runs in one process, so that it starts once."""


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: called only when it runs the tests
def pytest_xdist_make_scheduler(config, log):
    """Hand out whole groups (:func:`group`) to the processes. pytest-xdist's ``loadgroup`` would
    do it from ``xdist_group`` marks, but pytest 9.2 no longer lets it rename the tests it needs."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group(nodeid.split("::", 1)[0])

    return ByGroup(config, log)


def group(path: str) -> str:
    """The group of the tests in ``path``: services, a shared Airflow, else the module (whose
    module-scoped fixtures then start once)."""
    if path.startswith(SERVICES):
        return "services"
    return next((name for prefix, name in SHARED.items() if path.startswith(prefix)), path)
