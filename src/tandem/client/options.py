"""Connection URLs and options (Artemis's client knobs, in snake_case, with Artemis's defaults)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, overload
from urllib.parse import parse_qsl

from ..config import DEFAULT_NATIVE_PORT, parse_host_port
from ..errors import InvalidArgument


@dataclass(frozen=True)
class ConnectOptions:
    """Every option can come from the URL query or from keyword arguments (keywords win).

    Times are milliseconds, as in Artemis.
    """

    reconnect_attempts: int = 0
    initial_connect_attempts: int = 1
    retry_interval: int = 2000
    retry_interval_multiplier: float = 1.0
    max_retry_interval: int = 2000
    client_failure_check_period: int = 30_000
    connection_ttl: int = 60_000
    call_timeout: int = 30_000
    connect_timeout: int = 10_000
    ha: bool = False
    consumer_window_size: int = -2  # -2: the broker's default-consumer-window-size
    send_window: int = 1000  # unconfirmed sends in flight per producer
    producer_window_size: int = 64 * 1024  # bytes of credit asked for at a time (flow control, as Artemis)
    allow_passive: bool = False  # management only: talk to a waiting backup instead of skipping it
    auto_dedup: bool = True  # durable sends carry a dedup id and are resent after failover
    # Bytes of commands between the server's RECEIVED confirmations; -1: off. On: the server keeps
    # the sessions for connection_ttl after the socket fails and the client reattaches to them.
    confirmation_window_size: int = -1
    client_id: str | None = None
    username: str | None = None
    password: str | None = None
    max_frame_size: int = 100 * 1024 * 1024
    # A body over this is streamed to the broker in chunks of this size as a large message (the
    # client decides, as in Artemis); -1: never (bodies go whole, up to max_frame_size).
    min_large_message_size: int = 100 * 1024
    compress_large_messages: bool = False  # zlib a large body on the client (the broker stores what it gets)
    # TLS (client/tls.py): on with tcps:// URLs or ssl=true. `ca`: PEM CAs to check the server with
    # (None: the system's); `cert`/`key`: our certificate, for a server that asks (mutual TLS);
    # verify_host=false accepts any name in a certificate the CA signed: unsafe, tests only.
    ssl: bool = False
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    verify_host: bool = True

    def __post_init__(self) -> None:
        if self.reconnect_attempts < -1 or self.initial_connect_attempts < -1:
            raise InvalidArgument("`reconnect_attempts` and `initial_connect_attempts` must be >= -1")
        for name in ("retry_interval", "max_retry_interval", "client_failure_check_period", "call_timeout"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"`{name}` must be > 0 (milliseconds)")
        if self.retry_interval_multiplier < 1.0:
            raise InvalidArgument("`retry_interval_multiplier` must be >= 1.0")
        if self.send_window < 1:
            raise InvalidArgument("`send_window` must be >= 1")
        if self.producer_window_size < 1:
            raise InvalidArgument("`producer_window_size` must be >= 1 (bytes)")
        if self.confirmation_window_size == 0 or self.confirmation_window_size < -1:
            raise InvalidArgument("`confirmation_window_size` must be -1 (off) or a byte count > 0")
        if self.consumer_window_size < -2:
            raise InvalidArgument("`consumer_window_size` must be -1 (unbounded), 0 (pull) or a byte count")
        if (self.cert is None) != (self.key is None):
            raise InvalidArgument("`cert` and `key` go together (a client certificate and its private key)")
        if self.min_large_message_size != -1 and not 1024 <= self.min_large_message_size <= self.max_frame_size // 2:
            raise InvalidArgument("`min_large_message_size` must be -1 (off) or from 1024 to half of `max_frame_size`")


_FIELDS = {f.name: f for f in dataclasses.fields(ConnectOptions)}


def _coerce(name: str, value: Any) -> Any:
    ftype = _FIELDS[name].type
    if not isinstance(value, str):
        return value
    try:
        if ftype == "bool":
            low = value.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ValueError(value)
        if ftype == "int":
            return int(value)
        if ftype == "float":
            return float(value)
    except ValueError:
        raise InvalidArgument(f"option `{name}`: cannot read {value!r} as {ftype}") from None
    return value


@overload
def parse_url(
    url: str, explicit: Literal[False] = False, **overrides: Any
) -> tuple[list[tuple[str, int]], ConnectOptions]: ...


@overload
def parse_url(
    url: str, explicit: Literal[True], **overrides: Any
) -> tuple[list[tuple[str, int]], ConnectOptions, frozenset[str]]: ...


def parse_url(url: str, explicit: bool = False, **overrides: Any) -> Any:
    """`tcp://a:61616,tcp://b:61617?ha=true&reconnect_attempts=-1` → hosts and options
    (`tcps://a:61616?ca=ca.pem`: TLS)."""
    text = url.strip()
    query = ""
    if "?" in text:
        text, query = text.split("?", 1)
    hosts: list[tuple[str, int]] = []
    schemes = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        for scheme in ("tcp://", "tcps://"):
            if part.startswith(scheme):
                part = part[len(scheme) :]
                schemes.add(scheme)
                break
        else:
            if "://" in part:
                raise InvalidArgument(f"unsupported URL scheme in {part!r} (use tcp://host:port or tcps://host:port)")
        part = part.rstrip("/")
        if ":" not in part:
            part = f"{part}:{DEFAULT_NATIVE_PORT}"
        try:
            hosts.append(parse_host_port(part))
        except ValueError as exc:
            raise InvalidArgument(f"bad server address in URL: {exc}") from None
    if not hosts:
        raise InvalidArgument(f"no server address in URL {url!r}")
    values: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in _FIELDS:
            raise InvalidArgument(f"unknown connection option `{key}` in URL")
        values[key] = _coerce(key, value)
    for key, value in overrides.items():
        if key not in _FIELDS:
            raise InvalidArgument(f"unknown connection option `{key}`")
        values[key] = _coerce(key, value)
    if len(schemes) > 1:
        raise InvalidArgument(f"URL {url!r} mixes tcp:// and tcps://: use one for every server")
    if "tcps://" in schemes:
        if values.get("ssl") is False:
            raise InvalidArgument(f"URL {url!r}: tcps:// with ssl=false")
        values["ssl"] = True
    given = frozenset(values)
    # Departure from Artemis: a URL naming several servers means HA with endless retries.
    if len(hosts) > 1:
        values.setdefault("ha", True)
    if values.get("ha"):
        values.setdefault("reconnect_attempts", -1)
    try:
        opts = ConnectOptions(**values)
    except TypeError as exc:
        raise InvalidArgument(str(exc)) from None
    return (hosts, opts, given) if explicit else (hosts, opts)
