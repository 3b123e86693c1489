"""The activation sequence: a counter that tells a replica whose data is current from a stale one.

ZooKeeper keeps the coordinated value per node id (ha/coordinator.py); each data directory
keeps its own copy in `activation-sequence`. A server bumps both every time it activates and
every time it carries on without its backup, so the copy of a replica that missed a run no
longer matches and that replica never activates on old data (decision 0031).

A claim goes in two steps: the coordinated value becomes -N (N claimed, nobody serves at N
yet), the claimant writes N locally, then the value becomes N. A negative value is a claim
that was interrupted; its claimant never served at N, so a server whose copy equals the
value the claim started from (or N itself) holds data as current as any, and may claim on.
"""

from __future__ import annotations

import contextlib
import os
from enum import Enum
from pathlib import Path

from ..errors import IllegalState, InvalidArgument

SEQUENCE_FILE = "activation-sequence"


class Verdict(Enum):
    IN_SYNC = "in sync"  # the copy equals the coordinated value
    INTERRUPTED = "claim interrupted"  # a claim from our value (or of it) never committed
    STALE = "stale"  # someone activated since our data was current (or the values were set by hand)

    @property
    def may_activate(self) -> bool:
        return self is not Verdict.STALE


def judge(local: int, coordinated: int) -> Verdict:
    """May a server whose copy is `local` claim the next activation, ZooKeeper holding `coordinated`?"""
    if local < 0:
        raise InvalidArgument(f"a local activation sequence is never negative, got {local}")
    if coordinated == local:
        return Verdict.IN_SYNC
    if coordinated < 0 and -coordinated in (local, local + 1):
        return Verdict.INTERRUPTED
    return Verdict.STALE


def read_local_sequence(directory: Path) -> int:
    """The data directory's copy; 0 when it has none (a new directory)."""
    path = directory / SEQUENCE_FILE
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return 0
    except (OSError, UnicodeDecodeError) as exc:
        raise IllegalState(f"cannot read the activation sequence in {path}: {exc}") from None
    value = text.strip()
    if not value.isdigit():
        raise IllegalState(
            f"{path} is damaged (holds {text[:40]!r}, not a number): "
            "set it with `tandem data activation set` (docs/cli.md)"
        )
    return int(value)


def write_local_sequence(directory: Path, value: int) -> None:
    """Replace the copy atomically and durably: a crash leaves the old value or the new one, never a mix."""
    if value < 0:
        raise InvalidArgument(f"a local activation sequence is never negative, got {value}")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SEQUENCE_FILE
    tmp = directory / f".{SEQUENCE_FILE}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, f"{value}\n".encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)  # the rename itself
    finally:
        os.close(dir_fd)
