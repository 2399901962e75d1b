"""The FastAPI app the plugin mounts at ``/quota``: ``/api`` (REST) and ``/ui`` (the page).

Airflow mounts plugin apps without authentication, so every route declares its own access
dependency; FastAPI's own documentation routes are off and the OpenAPI document is served behind
authentication at ``/quota/api/openapi.json``.

A request that fails validation is answered 422 in FastAPI's shape (``detail``: a list of
``{loc, msg, type, input, ctx}``), but :func:`bounded_validation_errors` repeats at most
:data:`MAX_ECHO` characters of what the caller sent: a 5 MB body is not sent back, and values JSON
cannot carry (``NaN``, ``Infinity``, bytes) are shown as text instead of failing the response.

A request body larger than :data:`MAX_BODY_BYTES` is refused with 413 before any route reads it
(:class:`BodyLimit`): no request of this API needs more than a few hundred bytes.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from airflow.api_fastapi.core_api.security import requires_authenticated
from airflow_quota_provider.plugins import URL_PREFIX

MAX_ECHO = 100
"""Characters of a rejected value (or of a body key) that a 422 repeats."""
MAX_BODY_BYTES = 1 << 20
"""The largest request body the API reads (1 MiB); a larger one is answered 413."""
DRAIN_BYTES = 64 << 20
"""How much of a refused body is read and dropped so that the client sees the 413 (beyond it, the
connection is closed under the client)."""


def create_app() -> FastAPI:
    from airflow_quota_provider.plugins.api_routes import api_router
    from airflow_quota_provider.plugins.ui_routes import ui_router

    app = FastAPI(
        title="Airflow quota provider",
        description="Shared GPU quotas: job queues, quotas, jobs, the audit log and priority changes.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.include_router(api_router, prefix="/api")
    app.include_router(ui_router, prefix="/ui")
    app.add_exception_handler(RequestValidationError, bounded_validation_errors)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)

    @app.get("/api/openapi.json", dependencies=[Depends(requires_authenticated())], include_in_schema=False)
    def openapi() -> dict:
        return app.openapi()

    return app


async def bounded_validation_errors(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, with every repeated value made JSON-safe and cut to :data:`MAX_ECHO` characters."""
    errors = []
    for error in exc.errors():
        bounded = {
            "loc": [part if isinstance(part, int) else _cut(str(part)) for part in error.get("loc", ())],
            "msg": _cut(str(error.get("msg", "")), 500),
            "type": str(error.get("type", "")),
        }
        if "input" in error:
            bounded["input"] = echo(error["input"])
        if error.get("ctx"):
            bounded["ctx"] = {str(key): echo(value) for key, value in error["ctx"].items()}
        errors.append(bounded)
    return JSONResponse(status_code=422, content={"detail": errors})


def echo(value: Any) -> Any:
    """``value`` as a 422 may repeat it: itself when it is plain JSON of at most :data:`MAX_ECHO`
    characters, else a text of at most that many characters that says how long the whole was."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):  # NaN, Infinity, bytes, exceptions, very deep values
        return _cut(_text(value))
    return value if len(text) <= MAX_ECHO else _cut(text)


def _text(value: Any) -> str:
    if isinstance(value, BaseException):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    try:
        return repr(value)
    except (ValueError, RecursionError):  # an int of more digits than Python prints, a self-nesting value
        return f"<{type(value).__name__}>"


def _cut(text: str, limit: int = MAX_ECHO) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class BodyLimit:
    """ASGI middleware: read at most ``max_bytes`` of a request's body before the app sees it, and
    answer 413 when there is more (whether or not ``Content-Length`` said so)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._too_large(scope, receive, send, more=more)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, *, more: bool = True) -> None:
        # Read (and drop) what the client is still sending, up to a bound: closing a socket with
        # unread data resets the connection, and the client would never see the 413. ``more``:
        # whether any is left (a last chunk that crossed the limit left none, and waiting for
        # another would hang until the client gave up).
        drained = 0
        while more and drained <= DRAIN_BYTES:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            drained += len(message.get("body", b""))
            more = message.get("more_body", False)
        response = JSONResponse(
            status_code=413, content={"detail": f"request body larger than {self.max_bytes} bytes"}
        )
        await response(scope, receive, send)
