"""Run a real broker as a child process (real sockets, real fsync, real kills): for the tests and the chaos suite."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from . import procs

_LISTEN = re.compile(r"listening\s+(\S+): (\S+):(\d+)")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(v)


class BrokerProcess:
    """`tandem run` in a subprocess on 127.0.0.1 with an OS-chosen port.

    Settings are written to a TOML file; `extra_toml` is appended verbatim.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        name: str = "test",
        extra_toml: str = "",
        address_settings: dict[str, dict[str, Any]] | None = None,
        env: dict[str, str] | None = None,
        **settings: Any,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(env or {})  # extra environment (e.g. the journal's fault seam) for the next start
        self.config_path = self.data_dir.parent / f"{self.data_dir.name}.toml"
        defaults: dict[str, Any] = {
            "name": name,
            "data-directory": str(self.data_dir),
            "journal-file-size": 1024 * 1024,
            "journal-buffer-timeout": 0,
            "log-level": "info",
        }
        defaults.update({k.replace("_", "-"): v for k, v in settings.items()})
        lines = [f"{k} = {_toml_value(v)}" for k, v in defaults.items()]
        text = "\n".join(lines) + "\n" + extra_toml
        if "[[acceptors]]" not in extra_toml:
            text += '\n[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
        # Tables last: `extra_toml` may hold top-level keys (a pair's ha-policy, ...).
        tables = []
        for pattern, values in (address_settings or {}).items():
            tables.append(f'[address-settings."{pattern}"]')
            tables.extend(f"{k.replace('_', '-')} = {_toml_value(v)}" for k, v in values.items())
        if tables:
            text += "\n" + "\n".join(tables) + "\n"
        tomllib.loads(text)  # fail early on a typo in a test
        self.config_path.write_text(text)
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.ports: dict[str, int] = {}
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.banner = ""

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log = open(self.log_path, "a")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tandem", "run", "--config", str(self.config_path)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
        )
        log.close()
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_text()}")
                continue
            lines.append(line)
            m = _LISTEN.search(line)
            if m:
                self.ports[m.group(1)] = int(m.group(3))
            if line.startswith("Stop with Ctrl-C"):
                self.port = self.ports.get("native", 0)
                self.banner = "".join(lines)
                return self
        self.kill()
        raise RuntimeError(f"broker did not start within {timeout}s:\n{''.join(lines)}\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        procs.send_signal(self.proc, sig)

    def pause(self) -> None:
        """SIGSTOP, returning once the process is stopped (tandem.testing.procs.pause)."""
        assert self.proc is not None
        procs.pause(self.proc)

    def resume(self) -> None:
        """SIGCONT."""
        assert self.proc is not None
        procs.resume(self.proc)

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """Stopped for a `with` block, resumed whatever happens in it."""
        assert self.proc is not None
        return procs.paused(self.proc)

    def kill(self) -> None:
        """SIGKILL: nothing gets flushed, as in a power cut of the process."""
        if self.proc is not None:
            procs.kill(self.proc)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: a clean stop."""
        if self.proc is None:
            return 0
        try:
            procs.stop_process(self.proc, timeout=timeout)
        except procs.NotStopped:
            raise RuntimeError("broker did not stop on SIGTERM") from None
        self._close_pipe()
        return self.proc.returncode

    def wait_exit(self, timeout: float) -> int:
        """The exit status once the process ends by itself (raises TimeoutExpired after `timeout`)."""
        assert self.proc is not None
        rc = procs.wait_exit(self.proc, timeout)
        assert rc is not None  # our child: its status is known
        self._close_pipe()
        return rc

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
