"""The shared api-server (tests/quota_api_support.py) for the plugin tests."""

from __future__ import annotations

import pytest

from tests.quota_api_support import QuotaApiServer, shared_server


@pytest.fixture(scope="session")
def server(request) -> QuotaApiServer:
    return shared_server(request)
