"""A fault seam in the journal's I/O, for tests only: real code paths, errors on demand.

Off unless the environment variable ``TANDEM_JOURNAL_FAULTS`` is set (tests set it for the
broker processes they start). Its value is a comma-separated list of rules::

    [PREFIX:]STAGE=ACTION[@N]

``PREFIX`` limits a rule to one journal (``tandem-data`` for messages, ``tandem-bindings``), to
the page files' writer (``tandem-paging``: its ``create``, ``write``, ``sync`` and ``rename``
stages, store/pages.py), to large messages' files (``tandem-large``: ``create``, ``write``,
``sync``, ``rename`` and ``recycle``, store/large_messages.py) or to a replicating backup's
applier (``replica``: its ``write`` and ``sync`` stages);
``STAGE`` is where the journal touches the disk:

    write    writing a batch's records          sync     making a batch durable (fdatasync, or
    create   creating or reusing a file                  the RWF_DSYNC write that is its own sync)
    rename   renaming a file                    recycle  retiring a dead file
    compact  writing compaction output          dsync    the kernel's answer to RWF_DSYNC

``ACTION`` is an errno name (EIO, ENOSPC, EROFS, EOPNOTSUPP, EINVAL, ...) raised as OSError,
or ``delayS`` to sleep S seconds first. ``@N`` lets the first N calls of that stage through.
Examples: ``tandem-data:sync=EIO@20`` fails the 21st sync of the message journal and every
later one; ``dsync=EOPNOTSUPP`` makes every journal behave as on a kernel without RWF_DSYNC.

``TANDEM_JOURNAL_FAULTS_FILE`` names a file holding more rules in the same form, read again
whenever it changes (looked at no more than every 20 ms): the chaos suite arms a disk fault in a
running server by writing to it, at a moment of its choosing. A rule read from the file counts
the calls from the moment it appears.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "TANDEM_JOURNAL_FAULTS"
ENV_FILE = "TANDEM_JOURNAL_FAULTS_FILE"
FILE_CHECK = 0.02  # seconds between looks at the rules file
STAGES = ("write", "sync", "create", "rename", "recycle", "compact", "dsync")


@dataclass(frozen=True)
class Rule:
    stage: str
    error: int | None  # errno to raise
    delay: float
    after: int  # calls let through first


class Faults:
    """The rules that apply to one journal, with per-stage call counts."""

    def __init__(self, rules: list[Rule], prefix: str = "", path: str | None = None) -> None:
        self.rules = rules
        self._calls: dict[str, int] = {}
        self._lock = threading.Lock()  # the writer and the compactor threads both pass here
        self.prefix = prefix
        self.path = path  # the rules file (ENV_FILE), if any
        self._file_rules: list[Rule] = []
        self._file_calls: dict[str, int] = {}
        self._file_stamp: tuple[int, int] | None = None
        self._next_look = 0.0

    @classmethod
    def from_env(cls, prefix: str) -> Faults | None:
        text = os.environ.get(ENV, "").strip()
        path = os.environ.get(ENV_FILE, "").strip() or None
        rules = _rules(text, prefix)
        return cls(rules, prefix, path) if rules or path else None

    def _look(self) -> None:
        """Read the rules file again if it changed; its rules count calls from now on."""
        now = time.monotonic()
        if self.path is None or now < self._next_look:
            return
        self._next_look = now + FILE_CHECK
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp == self._file_stamp:
            return
        self._file_stamp = stamp
        try:
            text = Path(self.path).read_text() if stamp is not None else ""
        except OSError:
            text = ""
        self._file_rules = _rules(text, self.prefix)
        self._file_calls.clear()

    def hit(self, stage: str) -> None:
        """Called where the journal is about to do `stage`: sleeps or raises as the rules say."""
        with self._lock:
            self._look()
            n = self._calls[stage] = self._calls.get(stage, 0) + 1
            m = self._file_calls[stage] = self._file_calls.get(stage, 0) + 1
        for rule, calls in [*((r, n) for r in self.rules), *((r, m) for r in self._file_rules)]:
            if rule.stage != stage or calls <= rule.after:
                continue
            if rule.delay:
                time.sleep(rule.delay)
            if rule.error is not None:
                where = f"{self.prefix} {stage}" if self.prefix else stage
                raise OSError(rule.error, f"{os.strerror(rule.error)} (injected: journal fault seam, {where})")


def _rules(text: str, prefix: str) -> list[Rule]:
    """The rules of `text` (comma- or newline-separated) that apply to the journal `prefix`."""
    items = [i for i in text.replace("\n", ",").split(",") if i.strip()]
    return [r for p, r in (_parse(item) for item in items) if p in (None, prefix)]


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
