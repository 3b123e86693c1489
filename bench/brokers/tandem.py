"""Start and stop a Tandem broker process for benchmarks (production defaults, private data dir).

Usage::

    with TandemBroker() as b:
        print(b.url, b.pid)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

_LISTEN = re.compile(r"listening\s+(\S+): (\S+):(\d+)")


class TandemBroker:
    def __init__(self, data_dir: Path | None = None, extra_toml: str = "", keep: bool = False) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
        self.data_dir = data_dir or self._tmp / "data"
        self.keep = keep
        self.config = self._tmp / "broker.toml"
        self.config.write_text(
            f'data-directory = "{self.data_dir}"\n{extra_toml}\n[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
        )
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0  # the "native" acceptor's port
        self.ports: dict[str, int] = {}  # every acceptor's port, by acceptor name
        self.start_seconds = 0.0

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 120.0) -> TandemBroker:
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tandem", "run", "--config", str(self.config)],
            stdout=subprocess.PIPE,
            stderr=open(self._tmp / "broker.log", "a"),
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdout is not None
        while time.monotonic() - t0 < timeout:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"tandem exited: {(self._tmp / 'broker.log').read_text()[-2000:]}")
            m = _LISTEN.search(line)
            if m:
                self.ports[m.group(1)] = int(m.group(3))
            if m and m.group(1) == "native":
                self.port = int(m.group(3))
            if line.startswith("Stop with Ctrl-C"):
                self.start_seconds = time.monotonic() - t0
                return self
        raise RuntimeError("tandem did not start in time")

    def rss_kib(self) -> dict[str, int]:
        """Resident set size now and at its peak (VmHWM), from /proc."""
        out: dict[str, int] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def cleanup(self) -> None:
        self.stop()
        if not self.keep:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> TandemBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.cleanup()
