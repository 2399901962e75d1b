"""The REST API's body limit, driven directly as ASGI: what a client sends in chunks decides when it
is answered."""

from __future__ import annotations

import asyncio

from airflow_quota_provider.plugins.app import BodyLimit


def _answer(messages: list[dict], max_bytes: int) -> list[dict]:
    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # a client that has sent everything waits for the answer
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def app(scope, receive, send) -> None:
        raise AssertionError("the app must not see a body over the limit")

    call = BodyLimit(app, max_bytes=max_bytes)({"type": "http", "headers": []}, receive, send)
    asyncio.run(asyncio.wait_for(call, timeout=10))
    return sent


def test_a_last_chunk_that_crosses_the_limit_is_answered_at_once():
    """It failed by waiting for a chunk that never came (the client timed out instead of a 413)."""
    chunks = [{"type": "http.request", "body": b"x" * 600, "more_body": more} for more in (True, False)]
    assert _answer(chunks, max_bytes=1000)[0]["status"] == 413


def test_chunks_still_coming_after_the_limit_are_read_before_the_413():
    chunks = [{"type": "http.request", "body": b"x" * 600, "more_body": more} for more in (True, True, True, False)]
    sent = _answer(chunks, max_bytes=1000)
    assert sent[0]["status"] == 413 and chunks == []
