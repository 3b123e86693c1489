"""tests/coordinator_holder.py run as a child process, driven line by line (coordinator and
activation tests): it holds a node id's live lock until killed or frozen."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

SESSION_MS = 2000  # the holder's ZooKeeper session (the test ZooKeeper's tick is 500 ms)
TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"


class Holder:
    """tests/coordinator_holder.py in a child process: holds a live lock until killed."""

    def __init__(self, hosts: str, node_id: str, stderr: Path) -> None:
        env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        self.stderr = stderr
        with stderr.open("w") as err:  # the child keeps its own copy
            self.proc = self._start(hosts, node_id, env, err)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    @staticmethod
    def _start(hosts: str, node_id: str, env: dict[str, str], err: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(TESTS / "coordinator_holder.py"), hosts, node_id, str(SESSION_MS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        )

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with contextlib.suppress(ValueError, OSError):  # closed by kill()
            for line in self.proc.stdout:
                self.lines.put(line.strip())

    def expect(self, prefix: str | tuple[str, ...], timeout: float = 20.0) -> str:
        """The next line starting with `prefix` (other lines are skipped), within `timeout` seconds."""
        seen: list[str] = []
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        try:
            while not deadline.is_set():
                try:
                    line = self.lines.get(timeout=0.1)
                except queue.Empty:
                    continue
                if line.startswith(prefix):
                    return line
                seen.append(line)
        finally:
            timer.cancel()
        alive = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGUSR1)  # its threads' stacks, into its stderr
            time.sleep(0.5)
        pytest.fail(
            f"no line starting with {prefix!r} within {timeout} s; got {seen}; holder {alive}, "
            f"its stderr ends: {self.stderr.read_text()[-3000:]}"
        )

    def expect_each(self, prefixes: tuple[str, ...], timeout: float = 20.0) -> dict[str, str]:
        """A line starting with each prefix, in whatever order they come, within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        found: dict[str, str] = {}
        while len(found) < len(prefixes):
            want = [x for x in prefixes if x not in found]
            line = self.expect(tuple(want), max(0.1, deadline - time.monotonic()))
            found[next(x for x in want if line.startswith(x))] = line
        return found

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
