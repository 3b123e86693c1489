"""The client's TLS context (tcps:// URLs, ssl=true): server certificate and host name checked."""

from __future__ import annotations

import ssl

from ..errors import InvalidArgument
from .options import ConnectOptions


def client_context(opts: ConnectOptions) -> ssl.SSLContext:
    """TLS 1.2 or later; the server's chain checked against `ca` (or the system's CAs) and, unless
    `verify_host` is off, its name against the host we dial; our certificate when `cert` is set."""
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=opts.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = opts.verify_host  # the chain is checked either way
        if opts.cert is not None:
            ctx.load_cert_chain(opts.cert, opts.key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgument(f"cannot set up TLS (ca={opts.ca!r}, cert={opts.cert!r}): {exc}") from None
    return ctx


def split_server(text: str) -> tuple[str, int, bool] | None:
    """A topology entry (`host:port` or `tcps://host:port`) → host, port, TLS; None if unreadable."""
    tls = text.startswith("tcps://")
    if tls:
        text = text[len("tcps://") :]
    elif text.startswith("tcp://"):
        text = text[len("tcp://") :]
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port), tls
