"""Who may connect when `security-enabled`: the configured users and the cluster pair.

Secrets are compared with `hmac.compare_digest` over UTF-8 bytes (it takes only ASCII text), and
every configured pair is compared on each attempt, so the time taken does not tell a caller
which user name exists or how much of a password was right.
"""

from __future__ import annotations

import hmac

from ..config import BrokerConfig


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class Authenticator:
    def __init__(self, config: BrokerConfig) -> None:
        self.enabled = config.security_enabled
        # The cluster pair too: a waiting server announces itself with it (ha/announcer.py).
        cluster = (_utf8(config.cluster_user), _utf8(config.cluster_password))
        self._pairs = [cluster, *((_utf8(u.name), _utf8(u.password)) for u in config.users)]

    def check(self, username: str | None, password: str | None) -> bool:
        """True when security is off, or the pair is a configured user's or the cluster's."""
        if not self.enabled:
            return True
        if username is None:
            return False
        user, secret = _utf8(username), _utf8(password or "")
        ok = False
        for name, expected in self._pairs:  # no early exit: every pair costs the same
            ok |= hmac.compare_digest(name, user) & hmac.compare_digest(expected, secret)
        return ok


def is_cluster_pair(config: BrokerConfig, username: str, password: str) -> bool:
    """The cluster pair (a waiting server's announcement), whether or not security is on."""
    return hmac.compare_digest(_utf8(config.cluster_user), _utf8(username)) & hmac.compare_digest(
        _utf8(config.cluster_password), _utf8(password)
    )
