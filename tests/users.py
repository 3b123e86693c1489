"""Users for secured test brokers: the users file, written as `tandem user add` writes it.

    write_users(users_path(b), {"app": ("secret", ["producer"])})

`users_path(b)` is where a BrokerProcess's broker looks by default (users.toml next to its
config file, so the brokers of one test share it). A running broker picks the file up again
after `security-invalidation-interval` (or at once on SIGHUP).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from broker_process import BrokerProcess
from tandem import users as u


def users_path(b: BrokerProcess) -> Path:
    return b.config_path.parent / "users.toml"


def write_users(path: Path, users: Mapping[str, tuple[str, Iterable[str]]], n: int = u.DEFAULT_N) -> Path:
    """Replace the file with these users: name -> (password, roles). `n` lowers scrypt's cost
    for tests that write many users (the hash string says which cost it was made with)."""
    entries = {
        name: u.User(name, u.parse_hash(u.hash_password(password, n=n)), frozenset(roles))
        for name, (password, roles) in users.items()
    }
    u.write_users(path, entries)
    return path
