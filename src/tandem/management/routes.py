"""The API's routes, declared: a path and method -> a management operation and where its
arguments come from. A new endpoint is one `Route` in `ROUTES` (its op, in server/admin.py,
does the work and the checks; server/authorization.py says which permission it needs)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument

# How a query parameter's text becomes an op argument's value.
QueryType = Callable[[str], Any]


def boolean(text: str) -> bool:
    low = text.lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def integer(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


@dataclass(frozen=True)
class Route:
    """`path` in aiohttp's form (`{name}` placeholders); each placeholder is the op argument of
    the same name (text, or converted by `placeholders`). `query`: the query parameters taken
    (name -> conversion), each the op argument of the same name; any other parameter is a 400.
    `body`: a JSON object whose keys are op arguments. `fixed`: arguments always given.
    `shape`: makes the op's result the response's."""

    method: str
    path: str
    op: str
    query: Mapping[str, QueryType] = field(default_factory=dict)
    placeholders: Mapping[str, QueryType] = field(default_factory=dict)  # those that are not text
    body: bool = False
    fixed: Mapping[str, Any] = field(default_factory=dict)
    shape: Callable[[Any], Any] | None = None

    def args(self, match: Mapping[str, str], query: Mapping[str, str], body: Any) -> dict[str, Any]:
        """The op's arguments from the request's parts (raises InvalidArgument)."""
        out: dict[str, Any] = {}
        if self.body:
            if body is None:
                body = {}
            if not isinstance(body, dict):
                raise InvalidArgument(f"{self.method} {self.path}: the body must be a JSON object")
            out.update(body)
        for key, text in query.items():
            convert = self.query.get(key)
            if convert is None:
                known = ", ".join(self.query) or "none"
                raise InvalidArgument(f"unknown query parameter `{key}` (known: {known})")
            try:
                out[key] = convert(text)
            except ValueError as exc:
                raise InvalidArgument(f"query parameter `{key}`: {exc}") from None
        for key, text in match.items():
            convert = self.placeholders.get(key)
            if convert is None:
                out[key] = text
                continue
            try:
                out[key] = convert(text)
            except ValueError as exc:
                raise InvalidArgument(f"`{key}` in the path: {exc}") from None
        out.update(self.fixed)
        return out


def _one(rows: Any) -> Any:
    return rows[0]


ROUTES: list[Route] = [
    Route("GET", "/api/overview", "broker.overview"),
    Route("GET", "/api/addresses", "address.list"),
    Route(
        "GET",
        "/api/queues",
        "queue.list",
        query={"name": str, "page": integer, "page_size": integer, "sort": str},
    ),
    Route("GET", "/api/queues/{name}", "queue.stat", fixed={"detail": True}, shape=_one),
    Route("DELETE", "/api/queues/{name}/messages", "queue.purge"),
    Route(
        "GET",
        "/api/queues/{name}/messages",
        "queue.browse",
        query={"count": integer, "selector": str, "preview": integer},
    ),
    Route("POST", "/api/queues/{name}/move", "queue.move", body=True),
    Route("POST", "/api/queues/{name}/retry", "queue.retry", body=True),
    Route("POST", "/api/queues/{name}/pause", "queue.pause"),
    Route("POST", "/api/queues/{name}/resume", "queue.resume"),
    Route("GET", "/api/connections", "connection.list"),
    Route("DELETE", "/api/connections/{id}", "connection.close", placeholders={"id": integer}),
    Route("GET", "/api/consumers", "consumer.list"),
    Route("GET", "/api/ha", "broker.ha"),
    Route("GET", "/api/journal", "broker.journal", query={"max_files": integer}),
]
