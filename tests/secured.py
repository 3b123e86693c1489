"""Where the tests' users with roles come from: the one place to change when users move.

Users live in the users file (decision 0059), `users.toml` next to a broker's config file: a test
asks for a secured broker's settings here (which writes the file into `directory`, where
broker_factory puts the configs) and passes them to `broker_factory`, so only this module knows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from users import write_users

# Cheaper than the default scrypt cost (the hash string says which): many tests write users.
TEST_SCRYPT_N = 1024

CLUSTER_PASSWORD = "pair-secret"  # a secured broker refuses the built-in one


def password_of(user: str) -> str:
    return f"{user}-pw"


def write_users_file(directory: Path, users: Mapping[str, Iterable[str]]) -> Path:
    """The users (name -> roles), each with the password `password_of(name)`, as the users file
    of the brokers whose configs are in `directory`. The one place that says where the tests'
    users come from."""
    entries = {name: (password_of(name), roles) for name, roles in users.items()}
    return write_users(directory / "users.toml", entries, n=TEST_SCRYPT_N)


def secured(directory: Path, users: Mapping[str, Iterable[str]], extra_toml: str = "") -> dict[str, Any]:
    """broker_factory settings for a broker with security on and these users (written now into
    `directory`'s users file, see `write_users_file`); `extra_toml` (acceptors, security-settings
    tables) is the broker's."""
    write_users_file(directory, users)
    return {
        "security_enabled": True,
        "cluster_password": CLUSTER_PASSWORD,
        "extra_toml": extra_toml,
    }


def url_for(url: str, user: str) -> str:
    """A native URL that logs in as `user`."""
    return f"{url}?username={quote(user)}&password={quote(password_of(user))}"
