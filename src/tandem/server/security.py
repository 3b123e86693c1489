"""Who may connect when `security-enabled`: the configured users and the cluster pair.

Secrets are compared with `hmac.compare_digest` over UTF-8 bytes (it takes only ASCII text), and
every configured pair is compared on each attempt, so the time taken does not tell a caller
which user name exists or how much of a password was right.
"""

from __future__ import annotations

import hmac
import logging
import time
from dataclasses import dataclass

from ..config import BrokerConfig
from ..errors import clip

log = logging.getLogger("tandem.security")

FAILED_LOGIN_LOG_PERIOD = 10.0  # s: at most one warning line per period about failed logins


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Subject:
    """Who a connection is once logged in: what permission checks look at."""

    user: str | None  # None: security is off (nobody logged in)
    roles: frozenset[str] = frozenset()
    cluster: bool = False  # the server-to-server pair (cluster-user), not an application user


ANONYMOUS = Subject(None)


class Authenticator:
    def __init__(self, config: BrokerConfig) -> None:
        self.enabled = config.security_enabled
        self._logged_at = float("-inf")
        self._not_logged = 0  # failed logins since the last line
        # The cluster pair too: a waiting server announces itself with it (ha/announcer.py).
        cluster = (_utf8(config.cluster_user), _utf8(config.cluster_password))
        self._pairs = [cluster, *((_utf8(u.name), _utf8(u.password)) for u in config.users)]
        self._subjects = [
            Subject(config.cluster_user, cluster=True),
            *(Subject(u.name, frozenset(u.roles)) for u in config.users),
        ]

    def check(self, username: str | None, password: str | None, peer: str = "?") -> Subject | None:
        """ANONYMOUS when security is off; the subject of the configured user (or of the cluster
        pair) whose name and password these are; None when they are nobody's.

        A refusal is logged at warning (never the password), at most one line per
        FAILED_LOGIN_LOG_PERIOD: a client guessing passwords cannot flood the log."""
        if not self.enabled:
            return ANONYMOUS
        found: Subject | None = None
        if username is not None:
            user, secret = _utf8(username), _utf8(password or "")
            for (name, expected), subject in zip(self._pairs, self._subjects, strict=True):
                # no early exit: every pair costs the same
                if hmac.compare_digest(name, user) & hmac.compare_digest(expected, secret) and found is None:
                    found = subject
        if found is None:
            self._failed(username, peer)
        return found

    def subject_for(self, user: str) -> Subject | None:
        """A configured user's subject, no password asked (a verified certificate mapped to it)."""
        if not self.enabled:
            return ANONYMOUS
        return next((s for s in self._subjects if s.user == user and not s.cluster), None)

    def _failed(self, username: str | None, peer: str) -> None:
        now = time.monotonic()
        if now - self._logged_at < FAILED_LOGIN_LOG_PERIOD:
            self._not_logged += 1
            return
        more, self._not_logged, self._logged_at = self._not_logged, 0, now
        since = f" ({more} more since the last such line)" if more else ""
        log.warning("login failed for user %r from %s%s", clip(username or "", 100), peer, since)


def is_cluster_pair(config: BrokerConfig, username: str, password: str) -> bool:
    """The cluster pair (a waiting server's announcement), whether or not security is on."""
    return hmac.compare_digest(_utf8(config.cluster_user), _utf8(username)) & hmac.compare_digest(
        _utf8(config.cluster_password), _utf8(password)
    )
