"""A fault seam in the journal's I/O, for tests only: real code paths, errors on demand.

Off unless the environment variable ``TANDEM_JOURNAL_FAULTS`` is set (tests set it for the
broker processes they start). Its value is a comma-separated list of rules::

    [PREFIX:]STAGE=ACTION[@N]

``PREFIX`` limits a rule to one journal (``tandem-data`` for messages, ``tandem-bindings``) or
to a replicating backup's applier (``replica``: its ``write`` and ``sync`` stages);
``STAGE`` is where the journal touches the disk:

    write    writing a batch's records          sync     making a batch durable (fdatasync, or
    create   creating or reusing a file                  the RWF_DSYNC write that is its own sync)
    rename   renaming a file                    recycle  retiring a dead file
    compact  writing compaction output          dsync    the kernel's answer to RWF_DSYNC

``ACTION`` is an errno name (EIO, ENOSPC, EROFS, EOPNOTSUPP, EINVAL, ...) raised as OSError,
or ``delayS`` to sleep S seconds first. ``@N`` lets the first N calls of that stage through.
Examples: ``tandem-data:sync=EIO@20`` fails the 21st sync of the message journal and every
later one; ``dsync=EOPNOTSUPP`` makes every journal behave as on a kernel without RWF_DSYNC.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from dataclasses import dataclass

ENV = "TANDEM_JOURNAL_FAULTS"
STAGES = ("write", "sync", "create", "rename", "recycle", "compact", "dsync")


@dataclass(frozen=True)
class Rule:
    stage: str
    error: int | None  # errno to raise
    delay: float
    after: int  # calls let through first


class Faults:
    """The rules that apply to one journal, with per-stage call counts."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self._calls: dict[str, int] = {}
        self._lock = threading.Lock()  # the writer and the compactor threads both pass here

    @classmethod
    def from_env(cls, prefix: str) -> Faults | None:
        text = os.environ.get(ENV, "").strip()
        if not text:
            return None
        rules = [r for p, r in (_parse(item) for item in text.split(",") if item.strip()) if p in (None, prefix)]
        return cls(rules) if rules else None

    def hit(self, stage: str) -> None:
        """Called where the journal is about to do `stage`: sleeps or raises as the rules say."""
        with self._lock:
            n = self._calls.get(stage, 0) + 1
            self._calls[stage] = n
        for rule in self.rules:
            if rule.stage != stage or n <= rule.after:
                continue
            if rule.delay:
                time.sleep(rule.delay)
            if rule.error is not None:
                raise OSError(rule.error, f"{os.strerror(rule.error)} (injected: journal fault seam, {stage})")


def _parse(item: str) -> tuple[str | None, Rule]:
    spec = item.strip()
    prefix: str | None = None
    if ":" in spec.split("=", 1)[0]:
        prefix, spec = spec.split(":", 1)
    stage, sep, action = spec.partition("=")
    if not sep or stage not in STAGES:
        raise ValueError(f"{ENV}: bad rule {item!r} (stages: {', '.join(STAGES)})")
    after = 0
    if "@" in action:
        action, _, count = action.partition("@")
        after = int(count)
    if action.startswith("delay"):
        return prefix, Rule(stage, None, float(action[5:]), after)
    code = getattr(errno, action, None)
    if not isinstance(code, int):
        raise ValueError(f"{ENV}: unknown errno {action!r} in {item!r}")
    return prefix, Rule(stage, code, 0.0, after)
