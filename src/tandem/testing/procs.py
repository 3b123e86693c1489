"""Process faults for tests: kill -9, pause (SIGSTOP) and resume (SIGCONT), clean stops, bounded waits.

Every helper takes a `subprocess.Popen` or a bare pid, so it serves a broker (tests/broker_process.py),
a ZooKeeper server started by its fixture, or anything else a test started. With `group=True`
the signal goes to the process group the process leads (start it with `start_new_session=True`),
which reaches what a launcher script started. "Stop" here means a clean stop (SIGTERM);
"pause" is SIGSTOP.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Process = subprocess.Popen[Any] | int


class NotStopped(RuntimeError):
    """The process ignored the polite signal within the time given; it has been killed."""


def pid_of(proc: Process) -> int:
    return proc if isinstance(proc, int) else proc.pid


def _state(pid: int) -> str | None:
    """The kernel's one-letter state ('R', 'S', 'T' stopped, 'Z' zombie...), None if gone or unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def alive(proc: Process) -> bool:
    """Running or stopped; a zombie is not alive."""
    if not isinstance(proc, int):
        return proc.poll() is None
    try:
        os.kill(proc, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, someone else's
    return _state(proc) != "Z"


def send_signal(proc: Process, sig: int, *, group: bool = False) -> bool:
    """Deliver `sig`; False if there is nobody left to receive it."""
    pid = pid_of(proc)
    if not group and not isinstance(proc, int) and proc.poll() is not None:
        return False  # reaped: its pid may belong to someone else by now
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_exit(proc: Process, timeout: float) -> int | None:
    """The exit status (negative: killed by that signal) once the process has ended.

    Raises subprocess.TimeoutExpired after `timeout` seconds. A pid that is not our child can only
    be watched until it is gone: its status is not ours to read (None).
    """
    if not isinstance(proc, int):
        return proc.wait(timeout)
    deadline = time.monotonic() + timeout
    child = True
    while True:
        if child:
            try:
                done, status = os.waitpid(proc, os.WNOHANG)
            except ChildProcessError:
                child = False
            else:
                if done:
                    return os.waitstatus_to_exitcode(status)
        if not child and not alive(proc):
            return None
        if time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(str(proc), timeout)
        time.sleep(0.01)


def kill(proc: Process, *, group: bool = False, timeout: float = 10.0) -> int | None:
    """SIGKILL and wait until gone (reaped, if ours): nothing gets flushed, as in a power cut of the process."""
    send_signal(proc, signal.SIGKILL, group=group)
    return wait_exit(proc, timeout)


def stop_process(proc: Process, *, timeout: float = 20.0, sig: int = signal.SIGTERM, group: bool = False) -> int | None:
    """A clean stop: `sig`, then wait; past `timeout` SIGKILL and raise NotStopped."""
    send_signal(proc, sig, group=group)
    try:
        return wait_exit(proc, timeout)
    except subprocess.TimeoutExpired:
        kill(proc, group=group)
        raise NotStopped(f"process {pid_of(proc)} did not stop on signal {sig} within {timeout}s (killed)") from None


def _wait_state(pid: int, stopped: bool, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        state = _state(pid)
        if state is None or state in ("Z", "X") or (state in ("T", "t")) == stopped:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"process {pid} is still {state!r} after {timeout}s")
        time.sleep(0.002)


def pause(proc: Process, *, group: bool = False, timeout: float = 5.0) -> None:
    """SIGSTOP, returning once the kernel shows the process stopped (on Linux), so the pause is real."""
    if send_signal(proc, signal.SIGSTOP, group=group):
        _wait_state(pid_of(proc), True, timeout)


def resume(proc: Process, *, group: bool = False, timeout: float = 5.0) -> None:
    """SIGCONT; a no-op for a process that is gone."""
    if send_signal(proc, signal.SIGCONT, group=group):
        _wait_state(pid_of(proc), False, timeout)


@contextlib.contextmanager
def paused(proc: Process, *, group: bool = False) -> Iterator[None]:
    """Stopped for the duration of the block, and resumed whatever happens in it."""
    pause(proc, group=group)
    try:
        yield
    finally:
        resume(proc, group=group)


__all__ = [
    "NotStopped",
    "Process",
    "alive",
    "kill",
    "pause",
    "paused",
    "pid_of",
    "resume",
    "send_signal",
    "stop_process",
    "wait_exit",
]


def memory(pid: int | str, key: str = "VmRSS") -> int:
    """A process's VmRSS (or VmHWM, its peak) in bytes, from /proc (`pid` "self": this one)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no {key} in /proc/{pid}/status")
