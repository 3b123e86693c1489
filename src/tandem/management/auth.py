"""Who an HTTP request is (decision 0065): HTTP basic, or the session cookie of a login.

With security off nobody logs in (the listener is on loopback, config.check_network_exposure).
With security on, each request is one of:
- *basic*: `Authorization: Basic ...`, checked like a native login (server/security.py: the
  hash off the loop, the per-peer delays, the cache). A password never crosses a network in clear:
  basic (and the login below) is refused on a plain-HTTP listener that is not on loopback.
- *cookie*: `tandem_session`, set by `POST /api/login`. Sessions live in this process's memory
  (a restart or a failover logs everyone out), end after `session-timeout` without a request,
  and carry the user's name only: its roles are looked up in the users file at each request, so
  a user removed or given other roles is so at once. A request that changes something must also
  carry `X-Tandem-CSRF` with the token the login returned: another site's page can make the
  browser send the cookie, it cannot read the token (SameSite=Strict is the second fence).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "tandem_session"
CSRF_HEADER = "X-Tandem-CSRF"
MAX_SESSIONS = 10_000  # past it, the least recently used session ends
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass
class Session:
    user: str
    csrf: str
    expires: float  # time.monotonic()


def _key(token: str) -> bytes:
    """Sessions are found by a hash of their token: the table never holds a usable cookie."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class Sessions:
    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout  # s
        self._clock = clock
        self._by_key: OrderedDict[bytes, Session] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._by_key)

    def create(self, user: str) -> tuple[str, Session]:
        """A new session for `user`: (the cookie's token, the session)."""
        now = self._clock()
        self._expire(now)
        while len(self._by_key) >= MAX_SESSIONS:
            self._by_key.popitem(last=False)
        token = secrets.token_urlsafe(32)
        session = Session(user, secrets.token_urlsafe(32), now + self.timeout)
        self._by_key[_key(token)] = session
        return token, session

    def get(self, token: str) -> Session | None:
        """The live session of this token (its idle time starts over), or None."""
        key = _key(token)
        session = self._by_key.get(key)
        if session is None:
            return None
        now = self._clock()
        if session.expires <= now:
            del self._by_key[key]
            return None
        session.expires = now + self.timeout
        self._by_key.move_to_end(key)
        return session

    def drop(self, token: str) -> None:
        self._by_key.pop(_key(token), None)

    def _expire(self, now: float) -> None:
        while self._by_key:
            key, oldest = next(iter(self._by_key.items()))
            if oldest.expires > now:
                return
            del self._by_key[key]


def basic_credentials(header: str) -> tuple[str, str] | None:
    """(user, password) of an `Authorization: Basic` header (UTF-8, RFC 7617); None if not one."""
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        text = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = text.partition(":")
    return (user, password) if sep else None


def host_name(host_header: str) -> str:
    """The name or address of a `Host` header, without its port (IPv6 without brackets)."""
    h = host_header.strip()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    name, sep, port = h.rpartition(":")
    return name if sep and port.isdigit() else h


def cross_site(method: str, host: str | None, origin: str | None, fetch_site: str | None) -> bool:
    """Whether a browser sent this change from another site's page (the `Origin` a browser puts on
    every request but GET and HEAD is not this listener's, or `Sec-Fetch-Site` says so). Programs
    (curl, scrapers) send neither header: nothing is refused for them."""
    if method in SAFE_METHODS:
        return False
    if fetch_site == "cross-site":
        return True
    if origin is None:
        return False
    if origin == "null":  # a sandboxed frame, a file: page, a redirect across sites
        return True
    _scheme, sep, rest = origin.partition("://")
    return not sep or host is None or rest.rstrip("/").lower() != host.strip().lower()


def csrf_ok(session: Session, header: str | None) -> bool:
    return header is not None and hmac.compare_digest(session.csrf.encode(), header.encode("utf-8", "replace"))
