"""Test-wide settings: hypothesis runs 1,000 examples per property in CI (HYPOTHESIS_PROFILE=ci)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
