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


def secured(directory: Path, users: Mapping[str, Iterable[str]], extra_toml: str = "") -> dict[str, Any]:
    """broker_factory settings for a broker with security on and these users (name -> roles),
    each with the password `password_of(name)`; `extra_toml` is appended (acceptors, settings).
    `directory` is where a users file would go."""
    lines = []
    for name, roles in users.items():
        role_list = ", ".join(f'"{r}"' for r in roles)
        lines.append(f'[[users]]\nname = "{name}"\npassword = "{password_of(name)}"\nroles = [{role_list}]\n')
    return {
        "security_enabled": True,
        "cluster_password": CLUSTER_PASSWORD,
        "extra_toml": "".join(lines) + extra_toml,
    }


def url_for(url: str, user: str) -> str:
    """A native URL that logs in as `user`."""
    return f"{url}?username={quote(user)}&password={quote(password_of(user))}"
