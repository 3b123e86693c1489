"""Who may connect when `security-enabled`: the users of the users file, and the cluster pair.

A password is checked against its scrypt hash (tandem/users.py) in a small thread pool of its
own: a check costs some 50 ms of CPU, which the event loop must not spend. A peer (by address,
without the port) whose logins failed waits before its next one, twice as long after each failure
(`login-failure-delay` up to `login-failure-max-delay`), and its logins then take turns: a peer
guessing passwords gets one guess per delay however many connections it opens, and other peers'
logins go on meanwhile (decision 0059).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import secrets
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..config import BrokerConfig
from ..errors import ConfigError, clip
from ..users import PasswordHash, User, hash_password, parse_hash, read_users

log = logging.getLogger("tandem.security")

FAILED_LOGIN_LOG_PERIOD = 10.0  # s: at most one warning line per period about failed logins
# Hash checks at once, for all peers together: at least one core stays the event loop's.
LOGIN_THREADS = max(1, min(4, (os.cpu_count() or 2) - 1))
PEER_PARALLEL = 2  # of which one peer may have this many at once
CACHE_SIZE = 1000  # successful logins remembered (Artemis's authentication-cache-size)
PEER_MEMORY = 60.0  # s: a peer's failures are forgotten after this long without one
MAX_PEERS = 10_000  # peers remembered at once; past it, the idle ones are forgotten


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Subject:
    """Who a connection is once logged in: what permission checks look at."""

    user: str | None  # None: security is off (nobody logged in)
    roles: frozenset[str] = frozenset()
    cluster: bool = False  # the server-to-server pair (cluster-user), not an application user


ANONYMOUS = Subject(None)


@dataclass
class _Peer:
    """One peer address's logins: how many run now, how many failed lately, when it may try again."""

    gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(PEER_PARALLEL))
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)  # taken while the peer has failures
    busy: int = 0
    failures: int = 0
    last_failure: float = 0.0
    next_try: float = 0.0


def peer_host(peer: str) -> str:
    """`host:port` (as connections keep it) without the port: a peer's new connections share it."""
    host, sep, _port = peer.rpartition(":")
    return host if sep else peer


class Authenticator:
    def __init__(self, config: BrokerConfig) -> None:
        self.enabled = config.security_enabled
        self.path = Path(config.users_file)
        self._cluster = (_utf8(config.cluster_user), _utf8(config.cluster_password))
        self._cluster_subject = Subject(config.cluster_user, cluster=True)
        self._delay = config.login_failure_delay / 1000
        self._max_delay = config.login_failure_max_delay / 1000
        self._logged_at = float("-inf")
        self._not_logged = 0  # failed logins since the last line
        self.failed_logins = 0  # since start, every protocol (the /metrics counter)
        self._peers: dict[str, _Peer] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._users: dict[str, User] = {}
        self._changed: set[str] = set()  # users removed or changed by a reload, not yet taken
        # Successful logins for `security-invalidation-interval`, keyed by a keyed hash of the
        # name and password (the key never leaves this process): a storm of reconnections after
        # a failover costs a microsecond each, not a scrypt check each. Cleared on every reload.
        self._cache: dict[bytes, tuple[Subject, float]] = {}
        self._cache_key = secrets.token_bytes(32)
        self._cache_for = config.security_invalidation_interval / 1000
        self._stamp: tuple[int, int, int] | None = None
        # Unknown names are checked against this, so a refusal takes as long whether the name exists or not.
        self._dummy: PasswordHash = parse_hash(hash_password("", n=2, r=1, p=1))
        if self.enabled:
            if not self.path.exists():
                raise ConfigError(
                    f"`security-enabled` is true but the users file {self.path} does not exist: "
                    f"add a user with `tandem user add NAME --roles R1,R2 --users-file {self.path}`"
                )
            self._load()
            self._dummy = parse_hash(hash_password("not a password"))

    # ------------------------------------------------------------- users
    def _load(self) -> None:
        users = read_users(self.path)  # ConfigError (plain text, bad TOML): the caller decides
        if self._cluster_subject.user in users:
            raise ConfigError(
                f"users file {self.path}: user {self._cluster_subject.user!r} is also `cluster-user`: "
                "the cluster pair is for server-to-server links; give the application user another name"
            )
        old, self._users = self._users, users
        self._changed |= {name for name, u in old.items() if users.get(name) != u}
        self._cache.clear()
        self._stamp = self._file_stamp()
        mode = os.stat(self.path).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning(
                "users file %s can be read by other users of this machine (mode %o): its hashes could be "
                "guessed at offline; `chmod 600` it",
                self.path,
                stat.S_IMODE(mode),
            )

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def reload(self, force: bool = False) -> bool:
        """Read the users file again if it changed (or `force`); True when the users changed.

        A file that cannot be used (plain text, bad TOML) leaves the users as they were, with an
        error in the log; a file that is gone leaves nobody but the cluster pair. Connections
        logged in as a user the reload removed or changed are the broker's to close
        (`take_changed`)."""
        if not self.enabled:
            return False
        stamp = self._file_stamp()
        if stamp == self._stamp and not force:
            return False
        if stamp is None:
            log.warning("users file %s is gone: only the cluster pair can log in until it is back", self.path)
            self._changed |= set(self._users)
            self._users, self._stamp = {}, None
            self._cache.clear()
            return True
        try:
            self._load()
        except ConfigError as exc:
            self._stamp = stamp  # not read again until it changes again
            log.error("users file not reloaded, the users stay as they were: %s", exc.message)
            return False
        log.info("users file %s reloaded: %d users", self.path, len(self._users))
        return True

    def take_changed(self) -> set[str]:
        """The users that reloads removed, or whose password or roles they changed, since the last
        call: what they were allowed at their login no longer holds."""
        changed, self._changed = self._changed, set()
        return changed

    def subject_for(self, user: str) -> Subject | None:
        """The subject of a user of the users file, without a password (a TLS client certificate
        mapped to it); None when there is no such user. ANONYMOUS when security is off."""
        if not self.enabled:
            return ANONYMOUS
        u = self._users.get(user)
        return Subject(u.name, u.roles) if u is not None else None

    # ------------------------------------------------------------- logins
    async def check(
        self, username: str | None, password: str | None, peer: str = "?", protocol: str = "native"
    ) -> Subject | None:
        """ANONYMOUS when security is off; the subject of the user (or of the cluster pair) whose
        name and password these are; None when they are nobody's.

        Never blocks the loop: the hash is checked in the login threads, after the peer's delay."""
        if not self.enabled:
            return ANONYMOUS
        if username is None:
            self._failed(username, peer, protocol, None)
            return None
        name = _utf8(username)  # length first: no (name, password) pair reads as another
        key = hmac.new(self._cache_key, b"%d:%b%b" % (len(name), name, _utf8(password or "")), hashlib.sha256).digest()
        host = peer_host(peer)
        state = self._peers.get(host)
        if state is None or not state.failures:  # a peer with failures waits its turn, remembered or not
            cached = self._remembered(key)
            if cached is not None:
                return cached
        if state is None:
            if len(self._peers) >= MAX_PEERS:
                self._forget_idle(time.monotonic())
            state = self._peers[host] = _Peer()
        state.busy += 1
        try:
            async with state.gate:
                if state.failures:  # one login at a time for this peer, each after its delay
                    async with state.turn:
                        wait = state.next_try - time.monotonic()
                        if wait > 0:
                            await asyncio.sleep(wait)
                        subject = await self._attempt(username, password or "", peer, protocol, state, key)
                else:
                    subject = await self._attempt(username, password or "", peer, protocol, state, key)
        finally:
            state.busy -= 1
            if not state.busy and not state.failures and self._peers.get(host) is state:
                del self._peers[host]
        if subject is not None:
            if len(self._cache) >= CACHE_SIZE:
                del self._cache[next(iter(self._cache))]  # the oldest
            self._cache[key] = (subject, time.monotonic() + self._cache_for)
        return subject

    def _remembered(self, key: bytes) -> Subject | None:
        cached = self._cache.get(key)
        if cached is not None:
            if time.monotonic() < cached[1]:
                return cached[0]
            del self._cache[key]
        return None

    async def _attempt(
        self, username: str, password: str, peer: str, protocol: str, state: _Peer, key: bytes
    ) -> Subject | None:
        cached = self._remembered(key)
        if cached is not None:
            return cached
        try:
            subject = await self._verify(username, password)
        except asyncio.CancelledError:
            # The client left during its check (its connection closed): the check costs a hash
            # all the same, so it counts toward the peer's delay, unlogged; else closing right
            # after each HELLO would buy checks that never slow the peer down.
            self._count_failure(state, time.monotonic())
            raise
        if subject is None:
            self._failed(username, peer, protocol, state)
        return subject

    def _is_cluster_pair(self, username: str, password: str) -> bool:
        name, secret = self._cluster
        return hmac.compare_digest(name, _utf8(username)) & hmac.compare_digest(secret, _utf8(password))

    async def _verify(self, username: str, password: str) -> Subject | None:
        # The cluster pair too, after the peer's delay: checked before it, a peer could try
        # cluster passwords on many connections at once and see the right one answered first.
        if self._is_cluster_pair(username, password):
            return self._cluster_subject
        user = self._users.get(username)
        expected = user.password if user is not None and user.password is not None else self._dummy
        if self._closed:
            return None  # the broker stopped
        if self._pool is None:
            self._pool = ThreadPoolExecutor(LOGIN_THREADS, thread_name_prefix="tandem-login")
        ok = await asyncio.get_running_loop().run_in_executor(self._pool, expected.matches, password)
        if not ok or user is None:
            return None
        # The users file may have changed during the check: the user's entry as it is now.
        now = self._users.get(username)
        return Subject(now.name, now.roles) if now is not None and now.password == expected else None

    def _failed(self, username: str | None, peer: str, protocol: str, state: _Peer | None) -> None:
        now = time.monotonic()
        self.failed_logins += 1
        if state is not None:
            self._count_failure(state, now)
        if now - self._logged_at < FAILED_LOGIN_LOG_PERIOD:
            self._not_logged += 1
            return
        more, self._not_logged, self._logged_at = self._not_logged, 0, now
        since = f" ({more} more since the last such line)" if more else ""
        log.warning("login failed for user %r from %s over %s%s", clip(username or "", 100), peer, protocol, since)

    def refused(self, username: str, peer: str, what: str) -> None:
        """A wrong cluster pair outside a login (`cluster.announce`, a backup's REPLICA_START):
        logged and counted like a failed login, so the peer's next logins wait."""
        host = peer_host(peer)
        state = self._peers.get(host)
        if state is None:
            if len(self._peers) >= MAX_PEERS:
                self._forget_idle(time.monotonic())
            state = self._peers[host] = _Peer()
        self._failed(username, peer, what, state)

    def _count_failure(self, state: _Peer, now: float) -> None:
        if now - state.last_failure > PEER_MEMORY:
            state.failures = 0
        state.failures += 1
        state.last_failure = now
        state.next_try = now + min(self._delay * 2 ** min(state.failures - 1, 30), self._max_delay)

    def _forget_idle(self, now: float) -> None:
        for host, state in list(self._peers.items()):
            if not state.busy and now - state.last_failure > PEER_MEMORY:
                del self._peers[host]

    def housekeeping(self) -> None:
        """(Periodically) forget peers whose failures are old."""
        self._forget_idle(time.monotonic())

    def close(self) -> None:
        """The broker stops: checks not begun are dropped."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def is_cluster_pair(config: BrokerConfig, username: str, password: str) -> bool:
    """The cluster pair (a waiting server's announcement), whether or not security is on."""
    return hmac.compare_digest(_utf8(config.cluster_user), _utf8(username)) & hmac.compare_digest(
        _utf8(config.cluster_password), _utf8(password)
    )
