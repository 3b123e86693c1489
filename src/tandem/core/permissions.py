"""Who may do what on which address: Artemis's security-settings (docs/security.md, decision 0060).

`[security-settings."PATTERN"]` tables give, per permission, the roles that hold it. Patterns use
the address-settings wildcards (core/settings.py); for an address the most specific matching
pattern decides alone, nothing is inherited from less specific ones, and an address no pattern
matches allows nothing. The decision for a (roles, address) pair is cached (a dict lookup per
check, nothing more on the send path); the cache is bounded and cleared when the settings change.

This module knows roles and addresses only: the server passes a subject's roles in, and a
denial is an `Unauthorized` naming the permission and the address.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum

from ..errors import Unauthorized, clip
from .settings import check_pattern, pattern_specificity, words_match

log = logging.getLogger("tandem.security")

CACHE_LIMIT = 10_000  # (roles, address) decisions kept; past it the cache starts afresh (temporary names)
DENIAL_LOG_PERIOD = 60.0  # s: one log line per (user, permission, address) at most this often
DENIALS_REMEMBERED = 10_000  # (user, permission, address) keys kept for that; past it, forgotten
MANAGEMENT_ADDRESS = "tandem.management"  # what broker-wide management operations are checked on


class Permission(StrEnum):
    """A permission; its value is the config key (kebab-case), `artemis` Artemis's spelling.
    (A StrEnum: hashed and compared in C, as a str, on the send path.)"""

    SEND = "send"
    CONSUME = "consume"
    BROWSE = "browse"
    CREATE_ADDRESS = "create-address"
    DELETE_ADDRESS = "delete-address"
    CREATE_DURABLE_QUEUE = "create-durable-queue"
    DELETE_DURABLE_QUEUE = "delete-durable-queue"
    CREATE_NON_DURABLE_QUEUE = "create-non-durable-queue"
    DELETE_NON_DURABLE_QUEUE = "delete-non-durable-queue"
    MANAGE = "manage"
    VIEW = "view"
    EDIT = "edit"

    @property
    def artemis(self) -> str:
        head, *rest = self.value.split("-")
        return head + "".join(w.capitalize() for w in rest)


# Both spellings are accepted in a config file: `create-durable-queue` and `createDurableQueue`.
PERMISSION_NAMES: dict[str, Permission] = {
    **{p.value: p for p in Permission},
    **{p.artemis: p for p in Permission},
}


def parse_permission(name: str) -> Permission:
    try:
        return PERMISSION_NAMES[name]
    except KeyError:
        known = ", ".join(p.value for p in Permission)
        raise ValueError(f"unknown permission {name!r} (known: {known}; Artemis's camelCase works too)") from None


Table = Mapping[Permission, frozenset[str]]  # permission -> roles that hold it


class SecurityRepository:
    """The security-settings: for an address, the table of its most specific matching pattern."""

    def __init__(self, settings: Mapping[str, Mapping[str, Iterable[str]]] | None = None) -> None:
        items: list[tuple[str, tuple[str, ...], Table]] = []
        for pattern, perms in (settings or {}).items():
            check_pattern(pattern)
            table = {parse_permission(name): frozenset(roles) for name, roles in perms.items()}
            items.append((pattern, tuple(pattern.split(".")), table))
        # Most specific first (ties: by text, so the order never depends on the file's).
        items.sort(key=lambda it: it[0])
        items.sort(key=lambda it: pattern_specificity(it[0]), reverse=True)
        self._items = items

    def match(self, address: str) -> tuple[str | None, Table]:
        """(the winning pattern, its table); (None, {}) when none matches."""
        words = tuple(address.split("."))
        for pattern, pwords, table in self._items:
            if words_match(pwords, words):
                return pattern, table
        return None, {}

    def granted(self, roles: frozenset[str], address: str) -> frozenset[Permission]:
        _pattern, table = self.match(address)
        return frozenset(perm for perm, holders in table.items() if not holders.isdisjoint(roles))


class Authorizer:
    """Decides and caches; one per broker, shared by every connection."""

    def __init__(self, repository: SecurityRepository) -> None:
        self.repository = repository
        self._cache: dict[tuple[frozenset[str], str], frozenset[Permission]] = {}
        self._denied_at: dict[tuple[str | None, str, str], float] = {}
        # Told of every denial (user, peer, permission, address): the server's audit log.
        self.on_denied: Callable[[str | None, str, str, str], None] | None = None

    def reload(self, repository: SecurityRepository) -> None:
        """New security-settings: every cached decision goes."""
        self.repository = repository
        self.invalidate()

    def invalidate(self) -> None:
        """Forget cached decisions (the settings changed). A change of a user's roles needs no
        call: decisions are cached by the roles themselves, not by user."""
        self._cache.clear()

    def granted(self, roles: frozenset[str], address: str) -> frozenset[Permission]:
        key = (roles, address)
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            found = self._cache[key] = self.repository.granted(roles, address)
        return found

    def allowed(self, roles: frozenset[str], permission: Permission, address: str) -> bool:
        return permission in self.granted(roles, address)

    def check(self, user: str | None, roles: frozenset[str], permission: Permission, address: str) -> None:
        """Return if allowed, else log the denial (at most once per period) and raise Unauthorized."""
        if permission in self.granted(roles, address):
            return
        raise self.denied(user, permission.value, address)

    def denied(self, user: str | None, permission: str, address: str) -> Unauthorized:
        """The error for a denial of `permission` (its config name), logged unless it was lately."""
        key = (user, permission, address)
        now = time.monotonic()
        last = self._denied_at.get(key)
        if last is None or now - last >= DENIAL_LOG_PERIOD:
            if len(self._denied_at) >= DENIALS_REMEMBERED:
                self._denied_at.clear()
            self._denied_at[key] = now
            log.warning(
                "permission denied: user %r does not have permission '%s' on address %r",
                clip(user or "", 100),
                permission,
                clip(address, 200),
            )
        return Unauthorized(f"user {user!r} does not have permission '{permission}' on address {clip(address, 200)!r}")


class Access:
    """One logged-in subject's view of the authorizer (what a session checks against)."""

    __slots__ = ("_cache", "authorizer", "peer", "roles", "user")

    def __init__(self, authorizer: Authorizer, user: str | None, roles: frozenset[str], peer: str = "?") -> None:
        self.authorizer = authorizer
        self.user = user
        self.roles = roles
        self.peer = peer
        self._cache = authorizer._cache  # cleared in place, never replaced: read directly (send path)

    def check(self, permission: Permission, address: str) -> None:
        granted = self._cache.get((self.roles, address))
        if granted is None:
            granted = self.authorizer.granted(self.roles, address)
        if permission not in granted:
            raise self._denied(permission.value, address)

    def _denied(self, permission: str, address: str) -> Unauthorized:
        hook = self.authorizer.on_denied
        if hook is not None:
            hook(self.user, self.peer, permission, address)
        return self.authorizer.denied(self.user, permission, address)

    def allowed(self, permission: Permission, address: str) -> bool:
        return permission in self.authorizer.granted(self.roles, address)

    def check_management(self, mutating: bool, address: str) -> None:
        """`manage` allows every management operation; `view` the read-only ones, `edit` the others."""
        granted = self.authorizer.granted(self.roles, address)
        if Permission.MANAGE in granted or (Permission.EDIT if mutating else Permission.VIEW) in granted:
            return
        what = "manage' or 'edit" if mutating else "manage' or 'view"
        raise self._denied(what, address)
