"""Options of the `tandem` data source, checked up front: a bad one fails the query naming it.

Spark hands options over case-insensitively (writers see them lower-cased), so names are
matched without case. Client connection options (Artemis's names in snake_case, see
docs/client.md) pass through to the connections the source opens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..client.options import ConnectOptions

CLIENT_OPTIONS = {f.name for f in dataclasses.fields(ConnectOptions)}
SPARK_OWN = {"path", "checkpointlocation", "queryname"}  # Spark adds these for sinks


class OptionError(ValueError):
    """A bad, missing or unknown option of the tandem data source."""


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _split_client(opts: dict[str, str], known: set[str]) -> dict[str, str]:
    client: dict[str, str] = {}
    lowered_client = {c.lower(): c for c in CLIENT_OPTIONS}
    for key in list(opts):
        if key in lowered_client:
            client[lowered_client[key]] = opts.pop(key)
        elif key not in known and key not in SPARK_OWN:
            allowed = sorted(known | CLIENT_OPTIONS)
            raise OptionError(f"unknown option {key!r} for the tandem data source; known: {', '.join(allowed)}")
    return client


def _int(opts: dict[str, str], key: str, name: str, default: int, minimum: int) -> int:
    text = opts.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, got {text!r}") from None
    if value < minimum:
        raise OptionError(f"option {name!r} must be >= {minimum}, got {value}")
    return value


def _required(opts: dict[str, str], key: str, what: str) -> str:
    value = opts.get(key, "").strip()
    if not value:
        raise OptionError(f"option {key!r} is required ({what})")
    return value


# Connections opened inside tasks wait out a failover rather than fail the task at once.
TASK_CONNECT_ATTEMPTS = 15


def client_options(client: dict[str, str], connect_retries: bool = False) -> dict[str, Any]:
    """Client keyword options from the source's options (typed as the client expects)."""
    from ..client.options import _coerce

    out = {k: _coerce(k, v) for k, v in client.items()}
    if connect_retries:
        out.setdefault("initial_connect_attempts", TASK_CONNECT_ATTEMPTS)
    return out


@dataclass
class _Common:
    url: str
    client: dict[str, str] = field(default_factory=dict)

    def check_reachable(self) -> None:
        """Fail at query start, not in a task, if the broker cannot be reached or the URL is wrong."""
        import asyncio

        from ..client.connection import AsyncConnection
        from ..client.options import redact_url
        from ..errors import InvalidArgument, TandemError

        async def probe() -> None:
            extra = client_options(self.client)
            extra.setdefault("reconnect_attempts", 0)
            extra.setdefault("connect_timeout", 5000)
            conn = await AsyncConnection.connect(self.url, **extra)
            await conn.close()

        try:
            asyncio.run(probe())
        except InvalidArgument as exc:
            raise OptionError(f"option 'url' {redact_url(self.url)!r}: {exc.message}") from None
        except TandemError as exc:
            raise OptionError(
                f"option 'url': cannot reach the broker at {redact_url(self.url)!r}: {exc.message}"
            ) from None


READ_KEYS = {"url", "queue", "maxmessagespertrigger", "minpartitions", "bodyformat", "jsonschema"}


@dataclass
class ReadOptions(_Common):
    queues: list[str] = field(default_factory=list)
    max_messages_per_trigger: int = 0
    min_partitions: int = 1
    body_format: str = "binary"
    json_schema: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = _lower(options)
        client = _split_client(opts, READ_KEYS)
        url = _required(opts, "url", "the broker URL, e.g. tcp://127.0.0.1:61616")
        queues = sorted({q.strip() for q in _required(opts, "queue", "the queue(s) to read").split(",") if q.strip()})
        fmt = opts.get("bodyformat", "binary").lower()
        if fmt not in ("binary", "string", "json"):
            raise OptionError(f"option 'bodyFormat' must be binary, string or json, got {fmt!r}")
        schema = opts.get("jsonschema")
        if fmt == "json" and not schema:
            raise OptionError("option 'jsonSchema' is required with bodyFormat=json (a DDL string such as 'a INT')")
        out = cls(
            url=url,
            client=client,
            queues=queues,
            max_messages_per_trigger=_int(opts, "maxmessagespertrigger", "maxMessagesPerTrigger", 0, 0),
            min_partitions=_int(opts, "minpartitions", "minPartitions", len(queues), 1),
            body_format=fmt,
            json_schema=schema,
        )
        if schema:
            _check_ddl(schema)
        return out

    def body_ddl(self) -> str:
        """The body column's type, as DDL (Spark parses the schema; no session is needed here)."""
        if self.body_format == "string":
            return "STRING"
        if self.body_format == "json":
            return f"STRUCT<{self.json_schema}>"
        return "BINARY"


def _check_ddl(ddl: str) -> None:
    """A first check of a `name TYPE, ...` schema, so a typo is reported against the option."""
    depth = 0
    field_start = 0
    fields = []
    for i, ch in enumerate(ddl):
        depth += (ch in "<(" and 1) or (-1 if ch in ">)" else 0)
        if depth < 0:
            break
        if ch == "," and depth == 0:
            fields.append(ddl[field_start:i])
            field_start = i + 1
    fields.append(ddl[field_start:])
    if depth != 0 or not all(len(f.replace(":", " ").split()) >= 2 for f in fields):
        raise OptionError(f"option 'jsonSchema' must look like 'name TYPE, name TYPE', got {ddl!r}")


WRITE_KEYS = {"url", "address", "bodycolumn", "durable"}


@dataclass
class WriteOptions(_Common):
    address: str = ""
    body_column: str = "body"
    durable: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        opts = _lower(options)
        client = _split_client(opts, WRITE_KEYS)
        durable_text = opts.get("durable", "true").lower()
        if durable_text not in ("true", "false"):
            raise OptionError(f"option 'durable' must be true or false, got {durable_text!r}")
        return cls(
            url=_required(opts, "url", "the broker URL, e.g. tcp://127.0.0.1:61616"),
            client=client,
            address=_required(opts, "address", "the address to send to"),
            body_column=opts.get("bodycolumn", "body"),
            durable=durable_text == "true",
        )
