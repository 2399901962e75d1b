"""A job queue added to the shared api-server's quota file for the length of one test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import yaml

from airflow_quota_provider.policy import decide, parse_quota_file
from airflow_quota_provider.policy.state import Job, State

RESERVED_NEIGHBOUR = {
    "name": "reserved-fleet",
    "capacity": 8,
    "quotas": [
        {"name": "lender", "capacity": 4, "sharing": "lend_and_borrow"},
        {"name": "keeper", "capacity": 4, "sharing": "reserve"},
    ],
}
"""The issue's case: ``lender`` lends and borrows, but ``keeper``'s 4 GPUs are never lent, so
``lender`` can never hold more than 4 of the 8."""


@contextlib.contextmanager
def with_queue(server, queue: dict) -> Iterator[None]:
    """``queue`` appended to the server's quota file (read on every request), then the file restored."""
    path = server.instance.quota_path
    original = path.read_text()
    data = yaml.safe_load(original)
    data["queues"].append(queue)
    path.write_text(yaml.safe_dump(data))
    try:
        yield
    finally:
        path.write_text(original)


def executor_rejection(queue: dict, quota: str, gpus: int) -> str | None:
    """The reason the executor's decision cycle rejects a waiting job of ``gpus`` on ``quota``."""
    (parsed,) = parse_quota_file({"queues": [queue]}).queues
    job = Job(id="asks", quota=quota, gpus=gpus, priority=0, submitted_at=0.0)
    decision = decide(State.for_queue(parsed, running=(), pending=(job,)), now=1.0)
    return next((r.reason for r in decision.reject if r.id == "asks"), None)
