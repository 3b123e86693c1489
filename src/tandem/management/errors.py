"""How a Tandem error reads over HTTP: a status and `{"error": {"code", "message"}}`."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from ..errors import ErrorCode, TandemError

_STATUS = {
    ErrorCode.INVALID_ARGUMENT: 400,
    ErrorCode.INVALID_SELECTOR: 400,
    ErrorCode.UNAUTHORIZED: 403,  # logged in, not allowed (not logged in: 401, from the auth layer)
    ErrorCode.QUEUE_DOES_NOT_EXIST: 404,
    ErrorCode.ADDRESS_DOES_NOT_EXIST: 404,
    ErrorCode.CONSUMER_DOES_NOT_EXIST: 404,
    ErrorCode.SESSION_DOES_NOT_EXIST: 404,
    ErrorCode.MESSAGE_DOES_NOT_EXIST: 404,
    ErrorCode.CONNECTION_DOES_NOT_EXIST: 404,
    ErrorCode.QUEUE_EXISTS: 409,
    ErrorCode.ADDRESS_EXISTS: 409,
    ErrorCode.ILLEGAL_STATE: 409,
    ErrorCode.ADDRESS_FULL: 409,
    ErrorCode.RESOURCE_LIMIT: 429,
    ErrorCode.NOT_ACTIVE: 503,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.TIMEOUT: 504,
}


def status_of(code: ErrorCode) -> int:
    return _STATUS.get(code, 500)


def encode(value: Any) -> bytes:
    """JSON; anything msgspec does not know (an enum, a path) as its text."""
    return msgspec.json.encode(value, enc_hook=str)


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=encode(value), status=status, content_type="application/json", headers=headers)


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_response({"error": {"code": code, "message": message}}, status, headers)


def from_tandem(exc: TandemError) -> web.Response:
    return error_response(status_of(exc.code), exc.code.name, exc.message)
