"""A private ZooKeeper for one test or one chaos run: Debian's `zookeeper` package, 127.0.0.1, a temp dir, a free port.

scripts/ensure-zookeeper.sh installs the package (the Makefile's test set-up runs it). The
server runs in the foreground as a child JVM with a generated zoo.cfg; no system service is
involved. A short tick lets sessions expire within seconds, so "ZooKeeper lost" and
"session expired" tests stay short. `stop()` is a SIGKILL (ZooKeeper lost); `start()` again
brings it back on the same port with the same data, sessions included.
"""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from . import free_port

SHARE = Path("/usr/share/java")
# The jars the standalone server needs (the NIO connection factory, no admin server, slf4j-simple to its log).
JARS = ("zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-simple.jar")
MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


def classpath() -> str:
    missing = [j for j in JARS if not (SHARE / j).exists()]
    if missing or not glob.glob(str(SHARE / "zookeeper*.jar")):
        raise RuntimeError(f"ZooKeeper's jars are missing ({', '.join(missing)}): run scripts/ensure-zookeeper.sh")
    return ":".join(str(SHARE / j) for j in JARS)


class ZooKeeperServer:
    """One standalone ZooKeeper on 127.0.0.1:`port`, data under `root`."""

    def __init__(self, root: Path, tick_ms: int = 500) -> None:
        self.root = root
        self.port = free_port()
        self.tick_ms = tick_ms
        (root / "data").mkdir(parents=True, exist_ok=True)
        self.config = root / "zoo.cfg"
        self.config.write_text(
            f"tickTime={tick_ms}\n"
            f"dataDir={root / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            # Sessions between 2 and 40 ticks: 1 to 20 s with the default tick.
            f"minSessionTimeout={2 * tick_ms}\n"
            f"maxSessionTimeout={40 * tick_ms}\n"
            "4lw.commands.whitelist=ruok,srvr\n"
        )
        self.log = root / "zookeeper.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        """The connect string for kazoo and `[ha.coordinator] zookeeper`."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ZooKeeperServer:
        """Start (or restart) the server and wait until it answers `ruok`."""
        assert self.proc is None, "already running"
        cmd = ["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", classpath(), MAIN]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([*cmd, str(self.config)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"ZooKeeper exited at start:\n{self.log_text()[-3000:]}")
            if self.ruok():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not answer ruok within {timeout} s:\n{self.log_text()[-3000:]}")

    def ruok(self) -> bool:
        """True if the server answers ZooKeeper's `ruok` four-letter word with `imok`."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"ruok")
                return s.recv(8) == b"imok"
        except OSError:
            return False

    def stop(self) -> None:
        """Kill the server at once (ZooKeeper lost); its data stays for a later `start()`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # in case it was paused
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers (a silent ZooKeeper, not a refused one)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
