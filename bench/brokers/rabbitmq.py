"""Start and stop a private RabbitMQ node for benchmarks.

The node runs Debian's rabbitmq-server (see bench/setup-rabbitmq.sh) as a
child process bound to 127.0.0.1 only, with everything private to it:

* its own temporary base directory (Mnesia data, logs, config, cookie, HOME),
* its own node name, AMQP port, STOMP port and Erlang distribution port,
* its own epmd, started by this module on a private port and loopback only,
  so the system-wide epmd on 4369 is neither used nor started.

It is started with the package's own script, /usr/lib/rabbitmq/bin/
rabbitmq-server (not the /usr/sbin wrapper, which switches to the rabbitmq
user), configured only through the environment variables and files that
script and rabbit_env read, so it works as root and as an unprivileged user.

Usage::

    with RabbitMQNode() as node:
        print(node.amqp_port, node.stomp_port)

or ``python bench/brokers/rabbitmq.py`` to start one and wait for Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

RABBITMQ_HOME = Path("/usr/lib/rabbitmq")
RABBITMQ_SERVER = RABBITMQ_HOME / "bin" / "rabbitmq-server"
RABBITMQCTL = RABBITMQ_HOME / "bin" / "rabbitmqctl"
_PR_SET_PDEATHSIG = 1

#: Erlang VM flags: keep distribution on loopback. Scheduler binding is
#: switched off because the benchmark clients share the 2 cores with the VM.
_EXTRA_ERL_ARGS = "-kernel inet_dist_use_interface {127,0,0,1} +stbt u"

_CONFIG = """\
# Private benchmark node: loopback only, STOMP enabled.
stomp.listeners.tcp.1 = 127.0.0.1:{stomp_port}
stomp.default_user = guest
stomp.default_pass = guest
default_user = guest
default_pass = guest
disk_free_limit.absolute = 100MB
log.console = false
log.file.level = {log_level}
"""


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the harness process dies.

    The rabbitmq-server script forwards SIGTERM to the Erlang VM, so a
    harness killed without cleanup does not leave an orphaned node behind.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _find_epmd() -> str:
    """Locate the epmd binary shipped with Debian's erlang-base."""
    found = shutil.which("epmd")
    if found:
        return found
    for cand in sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd")):
        return str(cand)
    raise FileNotFoundError("epmd not found: run bench/setup-rabbitmq.sh first")


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    """Read exactly ``size`` bytes or raise ConnectionError."""
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def amqp_ready(host: str, port: int, timeout: float = 2.0) -> bool:
    """True if an AMQP 0-9-1 server on host:port answers with Connection.Start."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            frame_type, _channel, _size = struct.unpack(">BHI", _recv_exactly(sock, 7))
            class_id, method_id = struct.unpack(">HH", _recv_exactly(sock, 4))
            return frame_type == 1 and (class_id, method_id) == (10, 10)
    except OSError:
        return False


def stomp_ready(host: str, port: int, timeout: float = 2.0) -> bool:
    """True if a STOMP server on host:port answers CONNECT with CONNECTED."""
    frame = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00"
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(frame)
            reply = sock.recv(4096)
            with contextlib.suppress(OSError):
                sock.sendall(b"DISCONNECT\n\n\x00")
            return reply.lstrip(b"\r\n").startswith(b"CONNECTED")
    except OSError:
        return False


class RabbitMQNode:
    """A private RabbitMQ node run as a child process (a context manager)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        amqp_port: int | None = None,
        stomp_port: int | None = None,
        dist_port: int | None = None,
        epmd_port: int | None = None,
        nodename: str | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        keep_dir: bool = False,
        log_level: str = "warning",
        start_timeout: float = 120.0,
        cookie: str | None = None,
        own_epmd: bool = True,
    ) -> None:
        """Choose ports and paths; nothing is started until :meth:`start`."""
        if host != "127.0.0.1":
            raise ValueError("the benchmark node binds to 127.0.0.1 only")
        self.host = host
        self.amqp_port = amqp_port or free_port()
        self.stomp_port = stomp_port or free_port()
        self.dist_port = dist_port or free_port()
        self.epmd_port = epmd_port or free_port()
        self.nodename = nodename or f"tandem-bench-{os.getpid()}-{secrets.token_hex(3)}@localhost"
        self._given_dir = Path(base_dir) if base_dir is not None else None
        self.keep_dir = keep_dir or base_dir is not None
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.cookie = cookie  # nodes of one cluster share theirs
        self.own_epmd = own_epmd  # False: another node of the cluster runs the epmd on epmd_port
        self.base_dir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.epmd_process: subprocess.Popen[bytes] | None = None
        self._env: dict[str, str] = {}

    # -- paths -------------------------------------------------------------

    @property
    def log_dir(self) -> Path:
        """Directory holding the node's log files."""
        assert self.base_dir is not None
        return self.base_dir / "log"

    @property
    def amqp_url(self) -> str:
        """AMQP URL of the node (guest/guest, default vhost)."""
        return f"amqp://guest:guest@{self.host}:{self.amqp_port}/%2F"

    def _prepare(self) -> None:
        """Create the private directory tree, config files and environment."""
        if self._given_dir is not None:
            self.base_dir = self._given_dir
            self.base_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.base_dir = Path(tempfile.mkdtemp(prefix="tandem-rabbitmq-"))
        base = self.base_dir
        for sub in ("mnesia", "log", "home", "etc"):
            (base / sub).mkdir(exist_ok=True)
        cookie = base / "home" / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(self.cookie or secrets.token_hex(20))
        cookie.chmod(0o400)
        (base / "etc" / "rabbitmq.conf").write_text(
            _CONFIG.format(stomp_port=self.stomp_port, log_level=self.log_level)
        )
        (base / "etc" / "enabled_plugins").write_text("[rabbitmq_stomp].\n")
        (base / "etc" / "rabbitmq-env.conf").write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(base / "home"),
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS=self.host,
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_CONFIG_FILE=str(base / "etc" / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(base / "etc" / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "etc" / "enabled_plugins"),
            RABBITMQ_CONF_ENV_FILE=str(base / "etc" / "rabbitmq-env.conf"),
            RABBITMQ_PID_FILE=str(base / "rabbitmq.pid"),
            RABBITMQ_PLUGINS_EXPAND_DIR=str(base / "mnesia" / "plugins-expand"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=_EXTRA_ERL_ARGS,
            RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            RABBITMQ_CTL_DIST_PORT_MIN=str(self.dist_port + 1),
            RABBITMQ_CTL_DIST_PORT_MAX=str(self.dist_port + 10),
            ERL_EPMD_ADDRESS="127.0.0.1",
            ERL_EPMD_PORT=str(self.epmd_port),
            LC_ALL="C.UTF-8",
        )
        self._env = env

    # -- lifecycle ---------------------------------------------------------

    def _start_epmd(self) -> None:
        """Start a private epmd (foreground child) and wait until it listens."""
        self.epmd_process = subprocess.Popen(
            [_find_epmd(), "-port", str(self.epmd_port), "-address", "127.0.0.1"],
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.epmd_process.poll() is not None:
                raise RuntimeError(f"epmd exited with {self.epmd_process.returncode}")
            with contextlib.suppress(OSError):
                socket.create_connection((self.host, self.epmd_port), 0.5).close()
                return
            time.sleep(0.05)
        raise TimeoutError("epmd did not start listening")

    def start(self) -> RabbitMQNode:
        """Start epmd and the node; return once AMQP and STOMP both answer."""
        if not RABBITMQ_SERVER.exists():
            raise FileNotFoundError(f"{RABBITMQ_SERVER}: run bench/setup-rabbitmq.sh")
        self._prepare()
        assert self.base_dir is not None
        try:
            if self.own_epmd:
                self._start_epmd()
            out = (self.log_dir / "startup_stdout.log").open("wb")
            with out:
                self.process = subprocess.Popen(
                    [str(RABBITMQ_SERVER)],
                    env=self._env,
                    cwd=self.base_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        """Poll both listeners until they speak their protocol."""
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout
        amqp_ok = stomp_ok = False
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited with {self.process.returncode}\n" + self.log_tail())
            amqp_ok = amqp_ok or amqp_ready(self.host, self.amqp_port)
            stomp_ok = amqp_ok and (stomp_ok or stomp_ready(self.host, self.stomp_port))
            if amqp_ok and stomp_ok:
                return
            time.sleep(0.2)
        raise TimeoutError(
            f"RabbitMQ not ready after {self.start_timeout:.0f}s (amqp={amqp_ok}, stomp={stomp_ok})\n" + self.log_tail()
        )

    def log_tail(self, lines: int = 40) -> str:
        """Return the last lines of the startup output and node log."""
        if self.base_dir is None:
            return ""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run rabbitmqctl against this node and return its stdout."""
        proc = subprocess.run(
            [str(RABBITMQCTL), "-n", self.nodename, "-q", *args],
            env=self._env,
            cwd=self.base_dir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    @property
    def pid(self) -> int | None:
        """PID of the rabbitmq-server script (the direct child)."""
        return self.process.pid if self.process is not None else None

    @property
    def vm_pid(self) -> int | None:
        """PID of the Erlang VM (beam.smp) that runs the node, if found."""
        if self.process is None:
            return None
        sid = self.process.pid
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            if comm.startswith("beam") and int(fields[3]) == sid:
                return int(entry.name)
        return None

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
        """SIGTERM the process group, wait, then SIGKILL it."""
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # Kill leftovers of the group (erl_child_setup, inet_gethost) as well.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the node gracefully (SIGTERM), kill it if needed, then epmd."""
        self._terminate(self.process, timeout)
        self._terminate(self.epmd_process, 5)
        self.process = None
        self.epmd_process = None
        if self.base_dir is not None and not self.keep_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    def __enter__(self) -> RabbitMQNode:
        """Start the node."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the node."""
        self.stop()


class RabbitMQCluster:
    """Private nodes on loopback that share one epmd and one Erlang cookie, joined into a cluster
    with `rabbitmqctl join_cluster` (a context manager). Node 0 runs the epmd."""

    def __init__(self, size: int = 3, log_level: str = "warning") -> None:
        epmd_port = free_port()
        cookie = secrets.token_hex(20)
        tag = f"{os.getpid()}-{secrets.token_hex(2)}"
        self.nodes = [
            RabbitMQNode(
                epmd_port=epmd_port,
                cookie=cookie,
                own_epmd=i == 0,
                nodename=f"tandem-bench-{tag}-{i}@localhost",
                log_level=log_level,
            )
            for i in range(size)
        ]

    def start(self) -> RabbitMQCluster:
        try:
            for node in self.nodes:
                node.start()
            first = self.nodes[0].nodename
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", first)
                node.ctl("start_app")
                node._wait_ready()
            running = self.nodes[0].ctl("eval", "length(rabbit_nodes:all_running()).").strip()
            if running != str(len(self.nodes)):
                raise RuntimeError(f"{running} of {len(self.nodes)} nodes running in the cluster")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the joined nodes first and node 0 (with the epmd) last."""
        for node in reversed(self.nodes):
            node.stop()

    def __enter__(self) -> RabbitMQCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main() -> int:
    """Start a node, print its ports, and stop it on Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--amqp-port", type=int)
    parser.add_argument("--stomp-port", type=int)
    parser.add_argument("--base-dir")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    t0 = time.monotonic()
    with RabbitMQNode(amqp_port=args.amqp_port, stomp_port=args.stomp_port, base_dir=args.base_dir) as node:
        print(
            f"RabbitMQ {node.nodename} ready in {time.monotonic() - t0:.1f}s: "
            f"amqp={node.amqp_port} stomp={node.stomp_port} "
            f"dist={node.dist_port} epmd={node.epmd_port} pid={node.pid} "
            f"dir={node.base_dir}",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            while node.process is not None and node.process.poll() is None:
                time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
