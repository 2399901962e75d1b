"""The shared api-server (tests/quota_api_support.py) for QuotaCapacitySensor's tests."""

from __future__ import annotations

import pytest

from tests.quota_api_support import QuotaApiServer, shared_server


@pytest.fixture(scope="session")
def quota_api(request) -> QuotaApiServer:
    return shared_server(request)
