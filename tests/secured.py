"""Where the tests' users with roles come from: the one place to change when users move.

Today users are `[[users]]` tables of broker.toml (with `roles`); a test asks for a secured
broker's settings here and passes them to `broker_factory`, so only this function knows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

CLUSTER_PASSWORD = "pair-secret"  # a secured broker refuses the built-in one


def password_of(user: str) -> str:
    return f"{user}-pw"


def users_toml(users: Mapping[str, Iterable[str]]) -> str:
    """The users (name -> roles), each with the password `password_of(name)`, as top-level TOML
    (an inline array: it may go anywhere before the file's tables). The one place that says where
    the tests' users come from."""
    entries = []
    for name, roles in users.items():
        role_list = ", ".join(f'"{r}"' for r in roles)
        entries.append(f'{{ name = "{name}", password = "{password_of(name)}", roles = [{role_list}] }}')
    return f"users = [{', '.join(entries)}]\n"


def secured(directory: Path, users: Mapping[str, Iterable[str]], extra_toml: str = "") -> dict[str, Any]:
    """broker_factory settings for a broker with security on and these users (see `users_toml`);
    `extra_toml` (acceptors, security-settings tables) is appended. `directory` is where a users
    file would go."""
    return {
        "security_enabled": True,
        "cluster_password": CLUSTER_PASSWORD,
        "extra_toml": users_toml(users) + extra_toml,
    }


def url_for(url: str, user: str) -> str:
    """A native URL that logs in as `user`."""
    return f"{url}?username={quote(user)}&password={quote(password_of(user))}"
