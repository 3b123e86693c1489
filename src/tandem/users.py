"""The users file: who may log in when `security-enabled`, with scrypt password hashes and roles.

One TOML table per user, written by `tandem user` (decision 0059):

    [users."app"]
    password = "scrypt$n=16384,r=8,p=1$<salt, base64>$<hash, base64>"
    roles = ["producer"]

The hash string carries its own cost parameters, so they can be raised later without
invalidating the hashes already written. Anything else in `password` (a plain-text password,
an unknown scheme) is refused when the file is read, naming the user.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from .errors import ConfigError

SCHEME = "scrypt"
# scrypt's cost: N (CPU and memory, a power of two), r (block size), p (parallelism). 16384/8/1
# costs 16 MiB and some 50 ms per check, the figures Python's docs and OWASP give for logins.
DEFAULT_N, DEFAULT_R, DEFAULT_P = 16384, 8, 1
# A file may ask for more, up to these: a check that needed gigabytes would stop the broker.
MAX_N, MAX_R, MAX_P = 1 << 20, 32, 16
MAX_MEMORY = 128 << 20  # bytes one check may take (128 * r * n): eight times the default
SALT_BYTES = 16
HASH_BYTES = 32
MAX_NAME = 256

_HASH = re.compile(r"^scrypt\$n=(\d+),r=(\d+),p=(\d+)\$([A-Za-z0-9+/]+={0,2})\$([A-Za-z0-9+/]+={0,2})$")


@dataclass(frozen=True)
class PasswordHash:
    """A parsed `scrypt$...` string."""

    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def __str__(self) -> str:
        b64 = base64.b64encode
        return f"{SCHEME}$n={self.n},r={self.r},p={self.p}${b64(self.salt).decode()}${b64(self.digest).decode()}"

    def derive(self, password: str) -> bytes:
        """scrypt of `password` with this hash's salt and costs (slow on purpose: off the event loop)."""
        return _scrypt(password, self.salt, self.n, self.r, self.p, len(self.digest))

    def matches(self, password: str) -> bool:
        return hmac.compare_digest(self.derive(password), self.digest)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    maxmem = 128 * r * (n + p + 2) + (1 << 20)  # what OpenSSL needs for these costs, with room to spare
    return hashlib.scrypt(
        password.encode("utf-8", "surrogatepass"), salt=salt, n=n, r=r, p=p, maxmem=maxmem, dklen=length
    )


def hash_password(password: str, n: int = DEFAULT_N, r: int = DEFAULT_R, p: int = DEFAULT_P) -> str:
    """A new `scrypt$...` string for `password`, with a random salt."""
    _check_costs(n, r, p)
    salt = secrets.token_bytes(SALT_BYTES)
    return str(PasswordHash(n, r, p, salt, _scrypt(password, salt, n, r, p, HASH_BYTES)))


def _check_costs(n: int, r: int, p: int) -> None:
    if n < 2 or n & (n - 1) or n > MAX_N:
        raise ValueError(f"scrypt n must be a power of two between 2 and {MAX_N}, got {n}")
    if not 1 <= r <= MAX_R or not 1 <= p <= MAX_P:
        raise ValueError(f"scrypt r must be 1..{MAX_R} and p 1..{MAX_P}, got r={r}, p={p}")
    if 128 * r * n > MAX_MEMORY:
        raise ValueError(f"scrypt n={n}, r={r} would take {128 * r * n >> 20} MiB per check, over {MAX_MEMORY >> 20}")


def parse_hash(text: str) -> PasswordHash:
    """The parsed hash, or ValueError (a plain-text password, another scheme, a damaged string)."""
    m = _HASH.match(text)
    if m is None:
        raise ValueError("not a scrypt$n=..,r=..,p=..$salt$hash string")
    n, r, p = int(m.group(1)), int(m.group(2)), int(m.group(3))
    _check_costs(n, r, p)
    salt, digest = base64.b64decode(m.group(4)), base64.b64decode(m.group(5))
    if len(salt) < 8 or len(digest) < 16:
        raise ValueError("salt or hash too short")
    return PasswordHash(n, r, p, salt, digest)


def check_name(name: str) -> str:
    if not name or len(name) > MAX_NAME or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"a user name is 1 to {MAX_NAME} characters, none of them control characters: {name!r}")
    return name


def check_role(role: str) -> str:
    if (
        not role
        or len(role) > MAX_NAME
        or role != role.strip()
        or "," in role
        or any(ord(c) < 32 or ord(c) == 127 for c in role)
    ):
        raise ValueError(f"a role is a non-empty name without commas or surrounding spaces: {role!r}")
    return role


@dataclass(frozen=True)
class User:
    name: str
    password: PasswordHash | None  # None: only when read with `lenient` (`unusable` holds the text)
    roles: frozenset[str]
    unusable: str = ""  # what the file has instead of a hash (`tandem user` keeps it until `passwd`)


class _UserEntry(msgspec.Struct, forbid_unknown_fields=True):
    password: str = ""
    roles: list[str] = []


class _UsersFile(msgspec.Struct, forbid_unknown_fields=True):
    users: dict[str, _UserEntry] = {}


def parse_users(data: bytes, where: str, lenient: bool = False) -> dict[str, User]:
    """The users of a users file's bytes; ConfigError naming the file (and the user) otherwise.

    `lenient` (for `tandem user`, which must be able to fix them): a password that is not a
    usable hash gives a User without one instead of an error."""
    try:
        raw = msgspec.toml.decode(data, type=_UsersFile)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"users file {where}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"users file {where}: not valid TOML: {exc}") from None
    out: dict[str, User] = {}
    for name, entry in raw.users.items():
        try:
            check_name(name)
            roles = frozenset(check_role(r) for r in entry.roles)
        except ValueError as exc:
            raise ConfigError(f"users file {where}: user {name!r}: {exc}") from None
        if lenient:
            try:
                out[name] = User(name, parse_hash(entry.password), roles)
            except ValueError:
                out[name] = User(name, None, roles, entry.password)
            continue
        if not entry.password:
            raise ConfigError(
                f"users file {where}: user {name!r} has no password: set one with `tandem user passwd {name} "
                f"--users-file {where}`"
            )
        try:
            password = parse_hash(entry.password)
        except ValueError as exc:
            raise ConfigError(
                f"users file {where}: user {name!r} has a plain-text password or a hash Tandem does not know "
                f"({exc}): passwords are stored as scrypt hashes; set it with `tandem user passwd {name} "
                f"--users-file {where}`"
            ) from None
        out[name] = User(name, password, roles)
    return out


def read_users(path: Path, lenient: bool = False) -> dict[str, User]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read users file {path}: {exc.strerror}") from None
    return parse_users(data, str(path), lenient)


def render_users(users: dict[str, User]) -> str:
    """The file's text. JSON strings are TOML basic strings (the same escapes)."""
    lines = ["# Tandem users: edit with `tandem user add|passwd|roles|rm|list` (docs/security.md).", ""]
    for name in sorted(users):
        u = users[name]
        lines.append(f"[users.{json.dumps(name, ensure_ascii=False)}]")
        password = str(u.password) if u.password is not None else u.unusable
        lines.append(f"password = {json.dumps(password, ensure_ascii=False)}")
        lines.append(f"roles = [{', '.join(json.dumps(r, ensure_ascii=False) for r in sorted(u.roles))}]")
        lines.append("")
    return "\n".join(lines)


def write_users(path: Path, users: dict[str, User]) -> None:
    """Replace the file at once (a reader sees the old or the new one), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(render_users(users))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def editing(path: Path) -> Iterator[dict[str, User]]:
    """Read, let the caller change, write back; two `tandem user` commands at once take turns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(f".{path.name}.lock")
    with open(lock, "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        users = read_users(path, lenient=True) if path.exists() else {}
        yield users
        write_users(path, users)


def resolve_users_file(users_file: str | None, config_path: str | Path | None) -> Path:
    """`users-file` relative to the config file's directory; default users.toml next to it
    (or in the current directory when there is no config file)."""
    base = Path(config_path).parent if config_path is not None else Path(".")
    return base / (users_file if users_file is not None else "users.toml")
