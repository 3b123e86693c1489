"""Safe defaults and connection limits (decision 0062), over real sockets to real brokers.

A network acceptor with security off does not start; connections are bounded per acceptor,
per user and per peer address (ERROR RESOURCE_LIMIT, the broker serving the others); 2,000
connections that never log in all go at the handshake deadline; one connection cannot hold
unacknowledged deliveries or unread output without bound (what it held goes back to its
queue: nothing is lost).
"""

from __future__ import annotations

import os
import re
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_connection_limits import Wire, message_of

import tandem
from broker_process import BrokerProcess
from tandem.errors import ErrorCode, ResourceLimit
from tandem.protocol import native as p
from users import users_path, write_users

Factory = Callable[..., BrokerProcess]
ACCEPTORS = (
    '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
    '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
)
WAIT = 10.0  # s: bound on every wait for the broker to do something


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_URL"}
    return subprocess.run([sys.executable, "-m", "tandem", *args], capture_output=True, text=True, timeout=60, env=env)


def status(b: BrokerProcess, url: str | None = None) -> dict[str, Any]:
    with tandem.connect(url or b.url) as conn:
        return conn.manage("broker.status")  # type: ignore[no-any-return]


def open_count(b: BrokerProcess, acceptor: str = "native") -> int:
    """Connections the broker counts on `acceptor`, less the one asking."""
    return int(status(b)["connection_limits"]["open"].get(acceptor, 0)) - (acceptor == "native")


def wait_until(cond: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.05)


def echo(url: str, queue: str, text: str) -> None:
    """A well-behaved client sends and receives."""
    with tandem.connect(url) as conn:
        s = conn.session()
        s.create_producer(queue).send(text.encode())
        got = s.create_consumer(queue).receive(timeout=5)
        assert got is not None and got.body == text.encode()


@pytest.fixture
def wires() -> Iterator[Callable[..., Wire]]:
    made: list[Wire] = []

    def make(port: int, stomp: bool = False) -> Wire:
        w = Wire(port, stomp)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


# ========================================================= network binds without security


@pytest.mark.parametrize("protocol", ["native", "stomp"])
def test_a_network_acceptor_without_security_does_not_start(tmp_path: Any, protocol: str) -> None:
    """Exit 2, naming the acceptor and the keys; the STOMP acceptor is checked like the native one."""
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        f'data-directory = "{tmp_path / "data"}"\n'
        '[[acceptors]]\nname = "local"\nbind = "127.0.0.1:0"\n'
        f'[[acceptors]]\nname = "lan"\nprotocol = "{protocol}"\nbind = "0.0.0.0:0"\n'
    )
    r = cli("run", "--config", str(cfg))
    assert r.returncode == 2, r
    assert "'lan'" in r.stderr and "allow-insecure-network" in r.stderr and "security-enabled" in r.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


def test_the_bind_option_is_checked_too(tmp_path: Any) -> None:
    r = cli("run", "--data", str(tmp_path / "data"), "--bind", "0.0.0.0:0")
    assert r.returncode == 2, r
    assert "allow-insecure-network" in r.stderr


def test_allow_insecure_network_starts_a_network_acceptor(broker_factory: Factory) -> None:
    b = broker_factory(allow_insecure_network=True, extra_toml='[[acceptors]]\nname = "native"\nbind = "0.0.0.0:0"\n')
    b.start()
    echo(b.url, "safe.lan", "reachable")


def test_make_run_is_a_loopback_broker_that_starts(tmp_path: Any) -> None:
    """What `make run` runs (with port 0): starts with security off."""
    with subprocess.Popen(
        [sys.executable, "-m", "tandem", "run", "--data", str(tmp_path / "data"), "--bind", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        port = 0
        while time.monotonic() < deadline and not port:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening\s+\S+: 127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
        try:
            assert port, f"no listening line; exit {proc.poll()}"
            echo(f"tcp://127.0.0.1:{port}", "safe.make", "make run")
        finally:
            proc.kill()
            proc.wait(10)


# ================================================================== connection limits


def test_max_connections_per_acceptor(broker_factory: Factory, wires: Callable[..., Wire]) -> None:
    """Native: the next connection gets ERROR RESOURCE_LIMIT (tandem.ResourceLimit in the client)
    and is closed; once one closes, a new one is accepted. STOMP: an ERROR frame with the code."""
    acceptors = (
        '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\nmax-connections = 3\n'
        '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\nmax-connections = 2\n'
    )
    b = broker_factory(extra_toml=acceptors).start()
    first = tandem.connect(b.url)
    second = tandem.connect(b.url)
    third = tandem.connect(b.url)
    try:
        with pytest.raises(ResourceLimit, match="max-connections"):
            tandem.connect(b.url)
        w = wires(b.ports["native"])
        w.send(p.MAGIC + p.encode(p.Hello(p.PROTOCOL_VERSION, client_name="over")))
        err = w.closed_with_error()
        assert err.code == ErrorCode.RESOURCE_LIMIT and "'native'" in err.message
        # the three still work
        third.session().create_producer("safe.acc").send(b"x")
        assert first.session().create_consumer("safe.acc").receive(timeout=5) is not None
        second.close()
        deadline = time.monotonic() + WAIT
        while True:  # the broker counts the close when it sees it
            try:
                again = tandem.connect(b.url)
                break
            except ResourceLimit:
                assert time.monotonic() < deadline, "a closed connection was not released"
                time.sleep(0.05)
        with again:
            st = again.manage("broker.status")["connection_limits"]
            assert st["max_connections"] == {"native": 3, "stomp": 2}
            assert st["refused"]["acceptor"] >= 2 and st["open"]["native"] == 3
    finally:
        first.close()
        third.close()
    s1, s2 = wires(b.ports["stomp"], True), wires(b.ports["stomp"], True)
    s1.connect()
    s2.connect()
    s3 = wires(b.ports["stomp"], True)
    s3.send(b"CONNECT\naccept-version:1.2\nhost:x\n\n\0")
    err = s3.closed_with_error()
    assert err.headers.get("code") == "RESOURCE_LIMIT" and "max-connections" in message_of(err)
    s1.close()
    wait_until(lambda: open_count(b, "stomp") == 1, "the STOMP close counted")
    wires(b.ports["stomp"], True).connect()


def test_max_connections_per_user(broker_factory: Factory, wires: Callable[..., Wire]) -> None:
    """Counted from the login, per user (native and STOMP together); other users are not held."""
    b = broker_factory(
        security_enabled=True, cluster_password="pair", max_connections_per_user=2, extra_toml=ALLOW_ALL + ACCEPTORS
    )
    write_users(users_path(b), {"app": ("secret", ["all"]), "ops": ("other", ["all"])})
    b.start()
    app, ops = f"{b.url}?username=app&password=secret", f"{b.url}?username=ops&password=other"
    one = tandem.connect(app)
    s = wires(b.ports["stomp"], True)
    s.connect(login="app", passcode="secret")
    try:
        with pytest.raises(ResourceLimit, match=r"'app'.*max-connections-per-user"):
            tandem.connect(app)
        s2 = wires(b.ports["stomp"], True)
        s2.send(b"CONNECT\naccept-version:1.2\nhost:x\nlogin:app\npasscode:secret\n\n\0")
        assert "max-connections-per-user" in message_of(s2.closed_with_error())
        echo(ops, "safe.user", "ops is not app")
        s.close()
        deadline = time.monotonic() + WAIT
        while True:
            try:
                tandem.connect(app).close()
                break
            except ResourceLimit:
                assert time.monotonic() < deadline, "a closed connection was not released"
                time.sleep(0.05)
        assert status(b, ops)["connection_limits"]["refused"]["user"] == 2
    finally:
        one.close()


def test_max_connections_per_peer(broker_factory: Factory, wires: Callable[..., Wire]) -> None:
    """Per client IP address: 127.0.0.1 full, 127.0.0.2 still gets in."""
    b = broker_factory(max_connections_per_peer=2, extra_toml=ACCEPTORS).start()
    a = tandem.connect(b.url)
    w = wires(b.ports["stomp"], True)
    w.connect()
    try:
        over = wires(b.ports["native"])
        over.send(p.MAGIC + p.encode(p.Hello(p.PROTOCOL_VERSION, client_name="over")))
        err = over.closed_with_error()
        assert err.code == ErrorCode.RESOURCE_LIMIT and "127.0.0.1" in err.message
        other = socket.socket()
        other.bind(("127.0.0.2", 0))
        other.settimeout(5)
        other.connect(("127.0.0.1", b.ports["native"]))
        other.sendall(p.MAGIC + p.encode(p.Hello(p.PROTOCOL_VERSION, client_name="other peer")))
        reader = p.FrameReader(p.ServerPacket, 1 << 20, expect_magic=False)
        got: list[Any] = []
        while not got:
            data = other.recv(65536)
            assert data, "closed"
            got += reader.feed(data)
        assert isinstance(got[0], p.HelloOk), got
        other.close()
        w.close()
        wait_until(lambda: _try_connect(b.url), "a closed connection released")
    finally:
        a.close()


def _try_connect(url: str) -> bool:
    try:
        tandem.connect(url).close()
        return True
    except ResourceLimit:
        return False


# ==================================================== 2,000 idle connections, one handshake deadline

IDLE = 2000
HANDSHAKE_MS = 2000


def test_idle_connections_all_go_at_the_handshake_deadline_while_others_are_served(broker_factory: Factory) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = IDLE + 400  # ours, plus the broker's (it inherits the limit)
    if soft < need:
        assert hard == resource.RLIM_INFINITY or hard >= need, f"the hard fd limit {hard} is under {need}"
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    try:
        b = broker_factory(
            handshake_timeout=HANDSHAKE_MS,
            connection_check_period=100,
            log_level="warning",
            extra_toml=f'[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\nmax-connections = {IDLE + 50}\n',
        ).start()
        stop = threading.Event()
        served: list[int] = []
        failures: list[BaseException] = []

        def normal_client() -> None:
            try:
                with tandem.connect(b.url) as conn:
                    s = conn.session()
                    producer, consumer = s.create_producer("safe.busy"), s.create_consumer("safe.busy")
                    for i in range(100_000):
                        if stop.is_set():
                            return
                        producer.send(str(i).encode())
                        got = consumer.receive(timeout=5)
                        assert got is not None and got.body == str(i).encode()
                        served.append(i)
            except BaseException as exc:
                failures.append(exc)

        client = threading.Thread(target=normal_client)
        client.start()
        socks: list[socket.socket] = []
        try:
            opened = time.monotonic()
            for _ in range(IDLE):
                s = socket.create_connection(("127.0.0.1", b.port), timeout=5)  # connected, nothing sent
                s.setblocking(False)
                socks.append(s)
            connected = time.monotonic()
            assert connected - opened < HANDSHAKE_MS / 1000, "connecting took longer than the deadline"
            before = len(served)
            sel = selectors.DefaultSelector()  # (select() takes no descriptor over 1023)
            for s in socks:
                sel.register(s, selectors.EVENT_READ)
            open_ones = set(socks)
            deadline = opened + HANDSHAKE_MS / 1000 + 15
            closed_at: list[float] = []
            while open_ones and time.monotonic() < deadline:
                for key, _ in sel.select(0.2):
                    s = key.fileobj  # type: ignore[assignment]
                    try:
                        data = s.recv(65536)
                    except (ConnectionResetError, BlockingIOError):
                        data = b""
                    if not data:  # EOF (after the ERROR)
                        sel.unregister(s)
                        open_ones.discard(s)
                        closed_at.append(time.monotonic())
            sel.close()
            assert not open_ones, f"{len(open_ones)} of {IDLE} idle connections still open"
            # none before its deadline (each counts from its accept, after `opened`)
            assert min(closed_at) >= opened + HANDSHAKE_MS / 1000, "closed before the handshake deadline"
            assert len(served) > before, "the normal client was not served while the idle ones were cut"
        finally:
            stop.set()
            client.join(30)
            for s in socks:
                s.close()
        assert not failures, failures
        assert b.running
        wait_until(lambda: open_count(b) == 0, "every idle connection released")
        echo(b.url, "safe.after", "after the storm")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ============================================================== per-connection memory limits


def _answer(w: Wire, cmd: int) -> p.Response:
    """The RESPONSE to command `cmd`, leaving everything else (deliveries) in `w.got`."""
    deadline = time.monotonic() + WAIT
    while True:
        for x in w.got:
            if isinstance(x, (p.Response, p.Exception_, p.Error)) and getattr(x, "cmd", cmd) == cmd:
                w.got.remove(x)
                assert isinstance(x, p.Response), x
                return x
        assert not w.eof and time.monotonic() < deadline, f"no answer to command {cmd}: {w.got!r}"
        w.read(0.1)


def _consume_raw(w: Wire, queue: str, consumer_id: int = 1, window: int = -1) -> None:
    """A session on channel 1 (first time), then a consumer with `window` (-1: no flow control)."""
    if consumer_id == 1:
        w.send(p.encode(p.CreateSession(1, 1)))
        _answer(w, 1)
    w.send(p.encode(p.CreateConsumer(1, 1 + consumer_id, consumer_id, queue, None, window)))
    _answer(w, 1 + consumer_id)


def _deliveries(w: Wire, seconds: float) -> list[p.Deliver]:
    w.read(seconds)
    got = [x for x in w.got if isinstance(x, p.Deliver)]
    w.got = [x for x in w.got if not isinstance(x, p.Deliver)]
    return got


def _send(url: str, queue: str, n: int, size: int = 10) -> None:
    with tandem.connect(url) as conn:
        producer = conn.session().create_producer(queue)
        for i in range(n):
            producer.send(str(i).encode().ljust(size, b"."))


def test_unacknowledged_deliveries_per_connection_are_bounded(
    broker_factory: Factory, wires: Callable[..., Wire]
) -> None:
    """Window -1 (no flow control) and no acks: it gets max-unacked-messages, across its
    consumers; acks make room; the rest waits in the queue, and other connections are served."""
    b = broker_factory(max_unacked_messages=50).start()
    _send(b.url, "safe.unacked", 200)
    _send(b.url, "safe.unacked2", 20)
    w = wires(b.port)
    w.hello()
    _consume_raw(w, "safe.unacked")
    got = _deliveries(w, 1.0)
    assert len(got) == 50
    _consume_raw(w, "safe.unacked2", consumer_id=2)  # another consumer: the same connection's limit
    assert _deliveries(w, 0.5) == []
    w.send(p.encode(p.Ack(1, 100, 1, got[9].message_id, True)))  # ten acknowledged (confirmed later, no answer)
    more = _deliveries(w, 1.0)
    assert len(more) == 10
    echo(b.url, "safe.other", "another connection is served")
    with tandem.connect(b.url) as conn:
        assert conn.manage("queue.stat", name="safe.unacked")[0]["message_count"] == 190  # 60 out, 10 acked


def test_unacknowledged_bytes_per_connection_are_bounded(broker_factory: Factory, wires: Callable[..., Wire]) -> None:
    b = broker_factory(max_unacked_bytes=100_000).start()
    _send(b.url, "safe.bytes", 100, size=10_000)
    w = wires(b.port)
    w.hello()
    _consume_raw(w, "safe.bytes")
    got = _deliveries(w, 1.0)
    assert 9 <= len(got) <= 11, len(got)  # ~10 KB each (plus headers): stops once 100,000 bytes are out
    w.close()
    with tandem.connect(b.url) as conn:  # its deliveries back in the queue, none lost
        c = conn.session().create_consumer("safe.bytes")
        seen = {c.receive(timeout=5).body for _ in range(100)}  # type: ignore[union-attr]
        assert len(seen) == 100


def test_a_client_that_stops_reading_is_cut_and_its_deliveries_return(broker_factory: Factory) -> None:
    """Window -1, never reads: deliveries stop at the transport's high-water mark, and after
    slow-client-timeout without progress the connection is cut; the messages it never
    acknowledged are delivered to the next consumer, all of them."""
    n, size = 600, 50_000  # 30 MB: more than the socket buffers and the 4 MiB mark together
    b = broker_factory(max_unacked_messages=-1, max_unacked_bytes=-1, slow_client_timeout=1000, connection_ttl=60_000)
    b.start()
    _send(b.url, "safe.slow", n, size=size)
    sock = _non_reading_consumer(b, "safe.slow")
    try:
        # now read nothing: the broker's buffer fills, then it stays full
        wait_until(lambda: status(b)["connection_limits"]["refused"].get("slow-client") == 1, "the cut", 20)
        echo(b.url, "safe.other", "served meanwhile")
    finally:
        sock.close()
    with tandem.connect(b.url) as conn:
        c = conn.session().create_consumer("safe.slow")
        bodies = set()
        for _ in range(n):
            m = c.receive(timeout=5)
            assert m is not None, f"only {len(bodies)} of {n} came back"
            bodies.add(m.body[:8])
        assert len(bodies) == n
    assert "slow-client-timeout" in b.log_text()


def _fds(b: BrokerProcess) -> int:
    assert b.proc is not None
    return len(os.listdir(f"/proc/{b.proc.pid}/fd"))


def _non_reading_consumer(b: BrokerProcess, queue: str) -> socket.socket:
    """A native consumer (window -1) on a socket with a small receive buffer, that reads nothing more."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", b.port))
    w = Wire.__new__(Wire)  # a Wire over our own socket
    w.sock, w.stomp, w.got, w.raw, w.eof = sock, False, [], 0, False
    w.native = p.FrameReader(p.ServerPacket, 1 << 26, expect_magic=False)
    w.hello()
    _consume_raw(w, queue)
    return sock


def test_a_connection_closed_with_unread_output_lets_its_socket_go(broker_factory: Factory) -> None:
    """Cut for silence (its TTL) while its output is stuck: the close cannot flush, so the
    socket and its buffer are dropped after slow-client-timeout instead of staying for ever."""
    b = broker_factory(
        max_unacked_messages=-1, max_unacked_bytes=-1, connection_ttl=1000, connection_check_period=100,
        slow_client_timeout=2000,
    ).start()  # fmt: skip
    _send(b.url, "safe.linger", 300, size=50_000)
    baseline = _fds(b)
    sock = _non_reading_consumer(b, "safe.linger")
    try:
        wait_until(lambda: "no packet for" in b.log_text(), "the TTL cut")
        wait_until(lambda: _fds(b) <= baseline, "the broker let the socket go", timeout=15)
    finally:
        sock.close()
    with tandem.connect(b.url) as conn:
        assert conn.manage("queue.stat", name="safe.linger")[0]["message_count"] == 300


# ======================================================================== the audit log
# Every permission on every address for the role `all` (decision 0060: a secured broker
# allows nothing that no security-settings table grants).
ALLOW_ALL = '[security-settings."#"]\n' + "".join(
    f'{p} = ["all"]\n'
    for p in (
        "send", "consume", "browse", "create-address", "delete-address", "create-durable-queue",
        "delete-durable-queue", "create-non-durable-queue", "delete-non-durable-queue", "manage",
    )
)  # fmt: skip
AUDIT_USERS = {"app": ("secret", ["all"])}  # the users file


def audit_lines(b: BrokerProcess) -> list[str]:
    return [line for line in b.log_text().splitlines() if " tandem.audit: " in line]


def test_audit_log_lines_for_logins_and_management(broker_factory: Factory, wires: Callable[..., Wire]) -> None:
    """One line per event: who, from where, what, on what, allowed or not. A name chosen by a
    client is quoted, so it cannot forge a line or a field."""
    b = broker_factory(
        security_enabled=True, cluster_password="pair", audit_log=True, log_level="warning",
        extra_toml=ALLOW_ALL + ACCEPTORS,
    )  # fmt: skip
    write_users(users_path(b), AUDIT_USERS)
    b.start()
    url = f"{b.url}?username=app&password=secret"
    with tandem.connect(url) as conn:
        conn.manage("address.create", name="audit.addr")
        conn.manage("queue.create", name="audit.q", address="audit.addr")
        conn.manage("queue.purge", name="audit.q")
        conn.manage("queue.delete", name="audit.q")
        conn.manage("address.delete", name="audit.addr")
        with pytest.raises(tandem.TandemError):
            conn.manage("queue.purge", name="audit.none")
        conn.manage("broker.status")
        with pytest.raises(tandem.InvalidArgument):
            conn.manage("queue.explode", name="audit.q")
    bad = wires(b.ports["native"])
    bad.send(p.MAGIC + p.encode(p.Hello(p.PROTOCOL_VERSION, username="eve x\nuser=app", password="guess")))
    assert bad.closed_with_error().code == ErrorCode.UNAUTHORIZED
    stomp = wires(b.ports["stomp"], True)
    stomp.connect(login="app", passcode="secret")
    stomp.send(b"SUBSCRIBE\nid:1\ndestination:/queue/audit.stomp\nreceipt:r1\n\n\0")
    assert stomp.next().command == "RECEIPT"
    with tandem.connect(url) as conn:  # (the lines above are written by now)
        conn.session().create_consumer("audit.native")  # auto-created
        conn.manage("broker.status")
    lines = audit_lines(b)

    def one(*needles: str) -> str:
        found = [line for line in lines if all(n in line for n in needles)]
        assert len(found) >= 1, f"no audit line with {needles}:\n" + "\n".join(lines)
        return found[0]

    login = one("event=login", "allowed=yes", "protocol=native")
    assert "user=app" in login and "peer=127.0.0.1:" in login and "target=-" in login
    one("event=login", "allowed=yes", "protocol=stomp", "user=app")
    for event, target in [
        ("address.create", "audit.addr"),
        ("queue.create", "audit.q"),
        ("queue.purge", "audit.q"),
        ("queue.delete", "audit.q"),
        ("address.delete", "audit.addr"),
        ("broker.status", "-"),
    ]:
        one(f"event={event} ", f"target={target} ", "user=app", "allowed=yes")
    one("event=queue.purge", "target=audit.none", "error=QUEUE_DOES_NOT_EXIST")
    one("event=queue.explode", "target=audit.q", "error=INVALID_ARGUMENT")
    one("event=queue.create", "target=audit.stomp", "by=subscribe", "user=app")
    one("event=queue.create", "target=audit.native", "by=consumer", "user=app")
    failed = one("event=login", "allowed=no")
    assert "user=- " in failed and 'login="eve x\\x0auser=app"' in failed, failed
    assert "guess" not in b.log_text() and "secret" not in b.log_text()
    assert all(line.count(" event=") == 1 for line in lines)


def test_audit_log_is_off_by_default(broker_factory: Factory) -> None:
    b = broker_factory(log_level="info").start()
    with tandem.connect(b.url) as conn:
        conn.manage("queue.create", name="audit.off")
        conn.manage("queue.delete", name="audit.off")
    with tandem.connect(b.url) as conn:
        assert conn.manage("broker.status")["state"] == "active"
    assert "tandem.audit" not in b.log_text()
    assert "broker active" in b.log_text()  # (the log is there, at info)


@pytest.mark.timeout(60)
def test_the_unacked_limit_survives_a_reattach(broker_factory: Factory) -> None:
    """A reattached connection takes over its predecessor's count: at the limit before the link
    failed, its acknowledgements afterwards still make room (deliveries go on)."""
    import asyncio

    import tandem.aio as aio
    from client_io import send_confirmed
    from tandem.testing import AsyncFaultProxy, free_port

    port = free_port()
    b = broker_factory(
        max_unacked_messages=10, connection_check_period=100, connector_ref="via-proxy",
        extra_toml=f'[[connectors]]\nname = "via-proxy"\nurl = "127.0.0.1:{port}"\n',
    ).start()  # fmt: skip
    events: list[Any] = []

    async def main() -> None:
        await send_confirmed(b.url, "safe.ra", "ra-", 30)
        async with AsyncFaultProxy(b.port, port=port) as proxy:
            conn = await aio.connect(
                proxy.url, connection_ttl=10_000, confirmation_window_size=1024, auto_dedup=False,
                reconnect_attempts=-1, client_failure_check_period=500, connect_timeout=500, retry_interval=100,
            )  # fmt: skip
            conn.add_failure_listener(lambda kind, cause: events.append(kind))
            session = await conn.create_session(ack_mode="client")
            consumer = await session.create_consumer("safe.ra", window=-1)
            first = [await consumer.receive(5) for _ in range(10)]
            assert all(m is not None for m in first)
            assert await consumer.receive(0.5) is None  # at the limit
            await proxy.blackhole()
            await asyncio.sleep(1.5)
            await proxy.heal()
            deadline = time.monotonic() + 15
            while not events:
                assert time.monotonic() < deadline, "no reattach"
                await asyncio.sleep(0.05)
            assert events == [aio.FailureEvent.REATTACHED], events
            await first[-1].ack()  # type: ignore[union-attr]  # the ten (cumulative)
            more = [await consumer.receive(5) for _ in range(10)]
            assert all(m is not None for m in more), "no delivery after the acknowledgement"
            assert [m.text for m in more] == [f"ra-{i}" for i in range(10, 20)]  # type: ignore[union-attr]
            await conn.close()

    asyncio.run(main())


def test_stomp_unacknowledged_messages_are_bounded_too(broker_factory: Factory, wires: Callable[..., Wire]) -> None:
    """A STOMP subscription without prefetch (no flow control) in client ack mode: the same limit."""
    b = broker_factory(max_unacked_messages=20, extra_toml=ACCEPTORS).start()
    _send(b.url, "safe.stomp", 60)
    s = wires(b.ports["stomp"], True)
    s.connect()
    s.send(b"SUBSCRIBE\nid:1\ndestination:/queue/safe.stomp\nack:client\nprefetch-count:0\n\n\0")
    s.read(1.0)
    got = [f for f in s.got if f.command == "MESSAGE"]
    assert len(got) == 20
    s.got.clear()
    s.send(f"ACK\nid:{got[4].headers['ack']}\n\n\0".encode())  # client mode: the first five
    s.read(1.0)
    assert len([f for f in s.got if f.command == "MESSAGE"]) == 5


def test_a_stomp_client_that_stops_reading_is_cut_and_its_messages_return(broker_factory: Factory) -> None:
    n, size = 600, 50_000
    b = broker_factory(
        max_unacked_messages=-1, max_unacked_bytes=-1, slow_client_timeout=1000, extra_toml=ACCEPTORS
    ).start()
    _send(b.url, "safe.slowstomp", n, size=size)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", b.ports["stomp"]))
    try:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\0")
        assert sock.recv(4096).startswith(b"CONNECTED")
        sock.sendall(b"SUBSCRIBE\nid:1\ndestination:/queue/safe.slowstomp\nack:client\nprefetch-count:0\n\n\0")
        # and read nothing more
        wait_until(lambda: status(b)["connection_limits"]["refused"].get("slow-client") == 1, "the cut", 20)
    finally:
        sock.close()
    with tandem.connect(b.url) as conn:
        c = conn.session().create_consumer("safe.slowstomp")
        bodies = set()
        for _ in range(n):
            m = c.receive(timeout=5)
            assert m is not None, f"only {len(bodies)} of {n} came back"
            bodies.add(m.body[:8])
        assert len(bodies) == n


def test_audit_log_has_a_line_for_each_permission_denied(broker_factory: Factory) -> None:
    """Who was refused what, on which address, from where (decision 0060's denials, audited)."""
    perms = (
        '[security-settings."#"]\nconsume = ["reader"]\ncreate-address = ["reader"]\n'
        'create-durable-queue = ["reader"]\n'
    )
    b = broker_factory(
        security_enabled=True, cluster_password="pair", audit_log=True, log_level="warning", extra_toml=perms
    )
    write_users(users_path(b), {"reader": ("secret", ["reader"])})
    b.start()
    with tandem.connect(f"{b.url}?username=reader&password=secret") as conn:
        with pytest.raises(tandem.Unauthorized):
            conn.session().create_producer("audit.denied").send("no")
    lines = [line for line in audit_lines(b) if "event=denied" in line]
    assert lines, "\n".join(audit_lines(b))
    line = lines[0]
    assert "user=reader" in line and "permission=send" in line and "target=audit.denied" in line, line
    assert "allowed=no" in line and "peer=127.0.0.1:" in line, line


def test_sessions_consumers_and_temporary_queues_per_connection_are_bounded(
    broker_factory: Factory, wires: Callable[..., Wire]
) -> None:
    """One connection cannot open sessions, consumers (STOMP subscriptions too) or temporary queues
    without bound: the next one gets RESOURCE_LIMIT and the connection goes on."""
    b = broker_factory(
        max_sessions_per_connection=3,
        max_consumers_per_connection=4,
        max_temporary_queues_per_connection=2,
        extra_toml=ACCEPTORS,
    ).start()
    with tandem.connect(b.url) as conn:
        sessions = [conn.session() for _ in range(3)]
        with pytest.raises(ResourceLimit, match="max-sessions-per-connection"):
            conn.session()
        sessions[0].create_queue("safe.q", exists_ok=True)
        for s in sessions[:2]:
            s.create_consumer("safe.q")
            s.create_consumer("safe.q")
        with pytest.raises(ResourceLimit, match="max-consumers-per-connection"):
            sessions[2].create_consumer("safe.q")
        sessions[2].create_queue("safe.tmp1", temporary=True)
        sessions[2].create_queue("safe.tmp2", temporary=True)
        with pytest.raises(ResourceLimit, match="max-temporary-queues-per-connection"):
            sessions[2].create_queue("safe.tmp3", temporary=True)
        sessions[0].close()  # room again
        sessions[2].create_consumer("safe.q")
        assert conn.manage("broker.status")["state"] == "active"
    s = wires(b.ports["stomp"], True)
    s.connect()
    for i in range(4):
        s.send(f"SUBSCRIBE\nid:{i}\ndestination:/topic/safe.t{i}\nreceipt:r{i}\n\n\0".encode())
    s.send(b"SUBSCRIBE\nid:9\ndestination:/topic/safe.t9\nreceipt:r9\n\n\0")
    s.read(1.0)
    errors = [f for f in s.got if f.command == "ERROR"]
    assert errors and "max-consumers-per-connection" in errors[0].headers.get("message", ""), s.got
    assert len([f for f in s.got if f.command == "RECEIPT"]) == 4
