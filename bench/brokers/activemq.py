"""Start and stop a private ActiveMQ Classic broker for benchmarks.

The broker is Debian's ``activemq`` package (ActiveMQ Classic 5.17, see
bench/setup-activemq.sh), run as a child process bound to 127.0.0.1 only,
with everything private to it in one temporary base directory:

* ``conf/activemq.xml``: broker ``bench``, no JMX (``useJmx="false"``, so no
  JMX connector or RMI port either), no web console (Jetty is not started:
  there is no ``jetty.xml`` import), only two transport connectors, STOMP and
  OpenWire, each on 127.0.0.1 and a port of its own;
* ``conf/log4j.properties``: the broker log goes to ``data/activemq.log``;
* ``data/kahadb``: the KahaDB message store with its defaults (see
  :data:`KAHADB_DEFAULTS`: the journal is fsynced on every write batch before
  a persistent send is confirmed);
* ``tmp``: the JVM's temporary directory.

It is started the way the package's ``/usr/bin/activemq`` script starts it
(``java ... -jar /usr/share/activemq/bin/activemq.jar start xbean:file:...``: the
jar's Main-Class is org.apache.activemq.console.Main, which puts
``$activemq.home/lib`` and ``lib/optional`` on the class path;
with ``-Dactivemq.home/base/conf/data``), but directly: no pid file, no user
switch, no ``/var/lib/activemq``, no ``/etc/activemq`` instance. The JVM
options are the package's own (``/usr/share/activemq/activemq-options``):
``-Xms512M -Xmx512M -Dorg.apache.activemq.UseDedicatedTaskRunner=true``.

Usage::

    with ActiveMQNode() as node:
        print(node.stomp_port, node.openwire_port)

or ``python bench/brokers/activemq.py`` to start one and wait for Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

try:
    from .rabbitmq import _die_with_parent, free_port, stomp_ready
except ImportError:  # run as a script: bench/brokers is not a package then
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rabbitmq import _die_with_parent, free_port, stomp_ready  # type: ignore[no-redef]

ACTIVEMQ_HOME = Path("/usr/share/activemq")
ACTIVEMQ_JAR = ACTIVEMQ_HOME / "bin" / "activemq.jar"

#: JVM options of the Debian package (/usr/share/activemq/activemq-options).
PACKAGE_JVM_OPTS = ("-Xms512M", "-Xmx512M", "-Dorg.apache.activemq.UseDedicatedTaskRunner=true")

#: Module access the package's start script grants on Java > 8.
_JAVA_MODULE_OPTS = (
    "--add-reads=java.xml=java.logging",
    "--add-opens=java.base/java.security=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
)

#: KahaDB settings in force (all ActiveMQ 5.17 defaults, printed by
#: KahaDBPersistenceAdapter's getters): every journal write batch is forced to
#: disk before the producer's send is answered (a STOMP RECEIPT here), the
#: index is written in batches and checkpointed every 5 s (it is rebuilt from
#: the journal after a crash). With concurrentStoreAndDispatchQueues a message
#: may be dispatched while its store is under way; if it is acked before the
#: journal write, the write is cancelled (it never reaches the disk, and need not).
KAHADB_DEFAULTS = {
    "journalDiskSyncStrategy": "always",
    "enableJournalDiskSyncs": True,
    "concurrentStoreAndDispatchQueues": True,
    "indexWriteBatchSize": 1000,
    "enableIndexWriteAsync": False,
    "enableIndexDiskSyncs": True,
    "checkpointInterval_ms": 5000,
    "journalMaxFileLength_mb": 32,
    "preallocationStrategy": "sparse_file",
}

_ACTIVEMQ_XML = """\
<!-- Private benchmark broker: loopback only, STOMP + OpenWire, KahaDB with defaults, no JMX, no web console. -->
<beans xmlns="http://www.springframework.org/schema/beans"
       xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
       xsi:schemaLocation="http://www.springframework.org/schema/beans
         http://www.springframework.org/schema/beans/spring-beans.xsd
         http://activemq.apache.org/schema/core
         http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core"
          brokerName="bench" useJmx="false" persistent="true"
          dataDirectory="{data}" tmpDataDirectory="{data}/tmp_storage">
    <persistenceAdapter>
      <!-- journalDiskSyncStrategy="always" is the default, spelled out. -->
      <kahaDB directory="{data}/kahadb" journalDiskSyncStrategy="always"/>
    </persistenceAdapter>
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage percentOfJvmHeap="70"/></memoryUsage>
        <storeUsage><storeUsage limit="{store_limit}"/></storeUsage>
        <tempUsage><tempUsage limit="{temp_limit}"/></tempUsage>
      </systemUsage>
    </systemUsage>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://{host}:{stomp_port}"/>
      <transportConnector name="openwire" uri="tcp://{host}:{openwire_port}"/>
    </transportConnectors>
  </broker>
</beans>
"""

_LOG4J = """\
log4j.rootLogger={log_level}, logfile
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
log4j.appender.logfile=org.apache.log4j.FileAppender
log4j.appender.logfile.file={data}/activemq.log
log4j.appender.logfile.append=true
log4j.appender.logfile.layout=org.apache.log4j.PatternLayout
log4j.appender.logfile.layout.ConversionPattern=%d | %-5p | %m | %c | %t%n
"""


def openwire_ready(host: str, port: int, timeout: float = 2.0) -> bool:
    """True if an OpenWire server on host:port greets with its WireFormatInfo.

    The broker speaks first: a 4-byte size, command type 1 (WireFormatInfo)
    and the magic ``ActiveMQ``. Reading it before closing keeps the broker log
    free of "Could not accept connection" warnings.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            data = b""
            while len(data) < 13:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                data += chunk
    except OSError:
        return False
    return data[4] == 1 and data[5:13] == b"ActiveMQ"


class ActiveMQNode:
    """A private ActiveMQ Classic broker run as a child process (a context manager)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        stomp_port: int | None = None,
        openwire_port: int | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        keep_dir: bool = False,
        jvm_opts: tuple[str, ...] | list[str] = PACKAGE_JVM_OPTS,
        java: str | None = None,
        log_level: str = "INFO",
        store_limit: str = "20 gb",
        temp_limit: str = "5 gb",
        start_timeout: float = 120.0,
    ) -> None:
        """Choose ports and paths; nothing is started until :meth:`start`."""
        if host != "127.0.0.1":
            raise ValueError("the benchmark broker binds to 127.0.0.1 only")
        self.host = host
        self.stomp_port = stomp_port or free_port()
        self.openwire_port = openwire_port or free_port()
        while self.openwire_port == self.stomp_port:
            self.openwire_port = free_port()
        self._given_dir = Path(base_dir) if base_dir is not None else None
        self.keep_dir = keep_dir or base_dir is not None
        self.jvm_opts = list(jvm_opts)
        self.java = java
        self.log_level = log_level
        self.store_limit = store_limit
        self.temp_limit = temp_limit
        self.start_timeout = start_timeout
        self.base_dir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0

    # -- paths -------------------------------------------------------------

    @property
    def conf_dir(self) -> Path:
        """activemq.conf: activemq.xml and log4j.properties."""
        assert self.base_dir is not None
        return self.base_dir / "conf"

    @property
    def data_dir(self) -> Path:
        """activemq.data: KahaDB, temporary storage and the broker log."""
        assert self.base_dir is not None
        return self.base_dir / "data"

    @property
    def config_file(self) -> Path:
        """The broker's activemq.xml."""
        return self.conf_dir / "activemq.xml"

    @property
    def stomp_url(self) -> str:
        """STOMP address of the broker."""
        return f"stomp://{self.host}:{self.stomp_port}"

    @property
    def openwire_url(self) -> str:
        """OpenWire address of the broker."""
        return f"tcp://{self.host}:{self.openwire_port}"

    def _java(self) -> str:
        """The java binary: explicit, $JAVA_HOME, PATH, or Debian's default-java."""
        if self.java:
            return self.java
        java_home = os.environ.get("JAVA_HOME")
        if java_home and (Path(java_home) / "bin" / "java").exists():
            return str(Path(java_home) / "bin" / "java")
        found = shutil.which("java")
        if found:
            return found
        default = Path("/usr/lib/jvm/default-java/bin/java")
        if default.exists():
            return str(default)
        raise FileNotFoundError("java not found: run bench/setup-activemq.sh")

    def _prepare(self) -> None:
        """Create the private directory tree and configuration files."""
        if self._given_dir is not None:
            self.base_dir = self._given_dir
            self.base_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.base_dir = Path(tempfile.mkdtemp(prefix="tandem-activemq-"))
        for sub in ("conf", "data", "tmp"):
            (self.base_dir / sub).mkdir(exist_ok=True)
        data = str(self.data_dir)
        self.config_file.write_text(
            _ACTIVEMQ_XML.format(
                data=data,
                host=self.host,
                stomp_port=self.stomp_port,
                openwire_port=self.openwire_port,
                store_limit=self.store_limit,
                temp_limit=self.temp_limit,
            )
        )
        (self.conf_dir / "log4j.properties").write_text(_LOG4J.format(data=data, log_level=self.log_level))

    def command(self) -> list[str]:
        """The java command line that runs the broker in the foreground."""
        assert self.base_dir is not None
        base = self.base_dir
        return [
            self._java(),
            *self.jvm_opts,
            *_JAVA_MODULE_OPTS,
            "-Djava.awt.headless=true",
            f"-Djava.io.tmpdir={base / 'tmp'}",
            f"-Dactivemq.classpath={self.conf_dir}",
            f"-Dactivemq.home={ACTIVEMQ_HOME}",
            f"-Dactivemq.base={base}",
            f"-Dactivemq.conf={self.conf_dir}",
            f"-Dactivemq.data={self.data_dir}",
            "-jar",
            str(ACTIVEMQ_JAR),
            "start",
            f"xbean:file:{self.config_file}",
        ]

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> ActiveMQNode:
        """Start the broker; return once STOMP and OpenWire both answer."""
        if not ACTIVEMQ_JAR.exists():
            raise FileNotFoundError(f"{ACTIVEMQ_JAR}: run bench/setup-activemq.sh")
        t0 = time.monotonic()
        self._prepare()
        assert self.base_dir is not None
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("ACTIVEMQ_", "JAVA_TOOL_", "_JAVA_"))}
            env["LC_ALL"] = "C.UTF-8"
            with (self.data_dir / "stdout.log").open("wb") as out:
                self.process = subprocess.Popen(
                    self.command(),
                    env=env,
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
        self.start_seconds = time.monotonic() - t0
        return self

    def _wait_ready(self) -> None:
        """Poll the listeners until STOMP says CONNECTED and OpenWire greets."""
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout
        stomp_ok = openwire_ok = False
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ActiveMQ exited with {self.process.returncode}\n" + self.log_tail())
            stomp_ok = stomp_ok or stomp_ready(self.host, self.stomp_port)
            openwire_ok = openwire_ok or openwire_ready(self.host, self.openwire_port)
            if stomp_ok and openwire_ok:
                return
            time.sleep(0.2)
        raise TimeoutError(
            f"ActiveMQ not ready after {self.start_timeout:.0f}s (stomp={stomp_ok}, openwire={openwire_ok})\n"
            + self.log_tail()
        )

    def log_tail(self, lines: int = 40) -> str:
        """Return the last lines of the JVM's output and the broker log."""
        if self.base_dir is None:
            return ""
        parts = []
        for path in (self.data_dir / "stdout.log", self.data_dir / "activemq.log"):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    @property
    def pid(self) -> int | None:
        """PID of the broker's JVM (the direct child)."""
        return self.process.pid if self.process is not None else None

    def rss_kib(self) -> dict[str, int]:
        """Resident set size of the JVM now and at its peak (VmHWM), from /proc."""
        out: dict[str, int] = {}
        if self.pid is None:
            return out
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
        return out

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the JVM (its shutdown hook stops the broker), wait, then SIGKILL."""
        proc = self.process
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self.process = None
        if self.base_dir is not None and not self.keep_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    def __enter__(self) -> ActiveMQNode:
        """Start the broker."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the broker."""
        self.stop()


def main() -> int:
    """Start a broker, print its ports, and stop it on Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stomp-port", type=int)
    parser.add_argument("--openwire-port", type=int)
    parser.add_argument("--base-dir")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    node = ActiveMQNode(stomp_port=args.stomp_port, openwire_port=args.openwire_port, base_dir=args.base_dir)
    with node:
        print(
            f"ActiveMQ ready in {node.start_seconds:.1f}s: stomp={node.stomp_port} "
            f"openwire={node.openwire_port} pid={node.pid} dir={node.base_dir}",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            while node.process is not None and node.process.poll() is None:
                time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
