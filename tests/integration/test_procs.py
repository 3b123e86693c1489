"""Process faults on real child processes: SIGKILL, SIGSTOP/SIGCONT, clean stops, bounded waits."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.testing import procs

# A child that counts in a file every 10 ms: it makes progress only while it runs.
_COUNTER = """
import pathlib, sys, time
p = pathlib.Path(sys.argv[1])
n = 0
print("ready", flush=True)
while True:
    n += 1
    p.write_text(str(n))
    time.sleep(0.01)
"""

_DEAF = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def _spawn(code: str, *args: str, **kw: object) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc  # type: ignore[no-any-return]


@pytest.fixture
def reap() -> Iterator[list[subprocess.Popen[str]]]:
    made: list[subprocess.Popen[str]] = []
    yield made
    for p in made:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        if p.stdout is not None:
            p.stdout.close()


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_kill_is_sigkill_and_reaps(reap: list[subprocess.Popen[str]]) -> None:
    p = _spawn(_DEAF)
    reap.append(p)
    assert procs.kill(p) == -signal.SIGKILL
    assert p.returncode == -signal.SIGKILL
    assert procs.kill(p) == -signal.SIGKILL, "killing the dead is a no-op"


def test_paused_stops_the_process_and_always_resumes_it(tmp_path: Path, reap: list[subprocess.Popen[str]]) -> None:
    counter = tmp_path / "n"
    p = _spawn(_COUNTER, str(counter))
    reap.append(p)
    deadline = time.monotonic() + 10
    while not counter.exists():  # the child is counting before it is paused (it starts slowly under load)
        assert time.monotonic() < deadline, "the counter never started"
        time.sleep(0.02)
    with procs.paused(p):
        assert _state(p.pid) == "T"
        before = counter.read_text()
        time.sleep(0.3)
        assert counter.read_text() == before, "a paused process made progress"
    deadline = time.monotonic() + 5
    while counter.read_text() == before:
        assert time.monotonic() < deadline, "no progress after the resume"
        time.sleep(0.02)
    with pytest.raises(RuntimeError, match="boom"), procs.paused(p):
        raise RuntimeError("boom")
    assert _state(p.pid) != "T", "paused() resumes on the way out of an exception too"


def test_pause_resume_by_pid(reap: list[subprocess.Popen[str]]) -> None:
    p = _spawn(_DEAF)
    reap.append(p)
    procs.pause(p.pid)
    assert _state(p.pid) == "T"
    procs.resume(p.pid)
    assert _state(p.pid) != "T"


def test_wait_exit_is_bounded(reap: list[subprocess.Popen[str]]) -> None:
    p = _spawn(_DEAF)
    reap.append(p)
    with pytest.raises(subprocess.TimeoutExpired):
        procs.wait_exit(p, 0.2)
    procs.send_signal(p, signal.SIGKILL)
    assert procs.wait_exit(p, 10) == -signal.SIGKILL


def test_wait_exit_of_a_pid(reap: list[subprocess.Popen[str]]) -> None:
    p = _spawn(_DEAF)
    reap.append(p)
    with pytest.raises(subprocess.TimeoutExpired):
        procs.wait_exit(p.pid, 0.2)
    assert procs.kill(p.pid) == -signal.SIGKILL
    assert not procs.alive(p.pid)
    p.poll()  # Popen learns the pid was reaped elsewhere


def test_stop_process_terminates_then_escalates(reap: list[subprocess.Popen[str]]) -> None:
    polite = _spawn("print('ready', flush=True); import time; time.sleep(60)")
    reap.append(polite)
    assert procs.stop_process(polite, timeout=10) == -signal.SIGTERM
    deaf = _spawn(_DEAF)
    reap.append(deaf)
    with pytest.raises(procs.NotStopped):
        procs.stop_process(deaf, timeout=0.3)
    assert deaf.poll() == -signal.SIGKILL, "a process deaf to SIGTERM is killed"


def test_group_kill_reaches_grandchildren(reap: list[subprocess.Popen[str]]) -> None:
    code = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('ready', flush=True); print(c.pid, flush=True); time.sleep(60)\n"
    )
    p = _spawn(code, start_new_session=True)
    reap.append(p)
    assert p.stdout is not None
    grandchild = int(p.stdout.readline())
    assert procs.alive(grandchild)
    assert procs.kill(p, group=True) == -signal.SIGKILL
    procs.wait_exit(grandchild, 10)  # not our child: wait until it is gone
    assert not procs.alive(grandchild)


def test_signals_to_a_gone_process_are_no_ops(reap: list[subprocess.Popen[str]]) -> None:
    p = _spawn(_DEAF)
    reap.append(p)
    procs.kill(p)
    assert procs.send_signal(p, signal.SIGTERM) is False
    procs.resume(p)
    with procs.paused(p):  # nothing to pause
        pass
