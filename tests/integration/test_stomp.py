"""STOMP 1.0/1.1/1.2 against real broker processes: stomp.py as the client, raw sockets for edge cases.

Every broker here has a native and a STOMP acceptor on 127.0.0.1 (OS-chosen ports); the native
client checks what STOMP clients did (and the other way round).
"""

from __future__ import annotations

import re
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp
import stomp.exception

import tandem
from broker_process import BrokerProcess
from tandem.journal.faults import ENV as FAULTS_ENV
from tandem.protocol.stomp import SERVER_COMMANDS, Frame, StompParser
from users import users_path, write_users

STOMP_ACCEPTORS = (
    '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
    '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
)
VERSIONS = ("1.0", "1.1", "1.2")
CONNECTIONS = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}
SHARED_MAX_FRAME = 2048  # the shared broker's max-frame-size (the minimum allowed is 1 KiB)

Factory = Callable[..., BrokerProcess]


def stomp_broker(
    broker_factory: Factory,
    extra_toml: str = "",
    users: dict[str, tuple[str, list[str]]] | None = None,
    **settings: Any,
) -> BrokerProcess:
    b = broker_factory(extra_toml=STOMP_ACCEPTORS + extra_toml, **settings)
    if users is not None:  # a secured broker's users file
        write_users(users_path(b), users)
    return b.start()


@pytest.fixture
def sb(broker_factory: Factory) -> BrokerProcess:
    """A fresh broker with a STOMP acceptor."""
    return stomp_broker(broker_factory)


# ------------------------------------------------------------------------------ stomp.py side


class Recorder(stomp.ConnectionListener):
    """Everything a stomp.py connection hears, with bounded waits."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.connected: dict[str, str] = {}
        self.messages: list[Any] = []
        self.receipts: list[str] = []
        self.errors: list[Any] = []
        self.heartbeats = 0
        self.heartbeat_timeouts = 0
        self.disconnected = False

    def _note(self, fn: Callable[[], None]) -> None:
        with self.cond:
            fn()
            self.cond.notify_all()

    def on_connected(self, frame: Any) -> None:
        self._note(lambda: self.connected.update(frame.headers))

    def on_message(self, frame: Any) -> None:
        self._note(lambda: self.messages.append(frame))

    def on_receipt(self, frame: Any) -> None:
        self._note(lambda: self.receipts.append(frame.headers["receipt-id"]))

    def on_error(self, frame: Any) -> None:
        self._note(lambda: self.errors.append(frame))

    def on_heartbeat(self) -> None:
        def bump() -> None:
            self.heartbeats += 1

        self._note(bump)

    def on_heartbeat_timeout(self) -> None:
        def bump() -> None:
            self.heartbeat_timeouts += 1

        self._note(bump)

    def on_disconnected(self) -> None:
        def down() -> None:
            self.disconnected = True

        self._note(down)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def wait_messages(self, n: int, timeout: float = 5.0) -> list[Any]:
        ok = self.wait_for(lambda: len(self.messages) >= n, timeout)
        assert ok, f"got {len(self.messages)} of {n} messages: {[m.body for m in self.messages]}"
        return list(self.messages)

    def take(self, n: int, timeout: float = 5.0) -> list[Any]:
        """Wait for n messages and remove them from the record."""
        self.wait_messages(n, timeout)
        with self.cond:
            out, self.messages = self.messages[:n], self.messages[n:]
        return out

    def quiet(self, seconds: float = 0.4) -> list[Any]:
        """Whatever arrives within `seconds` (expected: nothing)."""
        self.wait_for(lambda: False, seconds)
        with self.cond:
            return list(self.messages)

    def wait_receipt(self, rid: str, timeout: float = 5.0) -> None:
        assert self.wait_for(lambda: rid in self.receipts, timeout), f"no RECEIPT {rid!r}; got {self.receipts}"


class Client:
    """A stomp.py connection (real sockets) with a Recorder and a few conveniences."""

    _n = 0

    def __init__(
        self,
        port: int,
        version: str = "1.2",
        *,
        login: str | None = None,
        passcode: str | None = None,
        heartbeats: tuple[int, int] = (0, 0),
        headers: dict[str, str] | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {"auto_decode": False, "reconnect_attempts_max": 1}
        if version != "1.0":
            kwargs["heartbeats"] = heartbeats
        self.version = version
        self.conn = CONNECTIONS[version]([("127.0.0.1", port)], **kwargs)
        self.rec = Recorder()
        self.conn.set_listener("recorder", self.rec)
        self.conn.connect(login, passcode, wait=True, headers=headers or {})
        assert self.rec.wait_for(lambda: bool(self.rec.connected)), "no CONNECTED seen by the listener"

    def rid(self) -> str:
        Client._n += 1
        return f"r-{Client._n}"

    def subscribe(self, destination: str, sid: str = "s1", ack: str = "auto", **headers: str) -> None:
        r = self.rid()
        self.conn.subscribe(destination, id=sid, ack=ack, headers={**headers, "receipt": r})
        self.rec.wait_receipt(r)

    def unsubscribe(self, sid: str, **headers: str) -> None:
        r = self.rid()
        if self.version == "1.0":
            self.conn.unsubscribe(id=sid, headers={**headers, "receipt": r})
        else:
            self.conn.unsubscribe(sid, headers={**headers, "receipt": r})
        self.rec.wait_receipt(r)

    def send(self, destination: str, body: bytes | str, wait: bool = True, **headers: str) -> str:
        r = self.rid()
        self.conn.send(destination, body, headers={**headers, "receipt": r})
        if wait:
            self.rec.wait_receipt(r)
        return r

    def ack(self, msg: Any, transaction: str | None = None, receipt: str | None = None) -> None:
        h = msg.headers
        if self.version == "1.2":
            self.conn.ack(h["ack"], transaction=transaction, receipt=receipt)
        elif self.version == "1.1":
            self.conn.ack(h["message-id"], h["subscription"], transaction=transaction, receipt=receipt)
        else:
            self.conn.ack(h["message-id"], transaction=transaction, receipt=receipt)

    def nack(self, msg: Any, receipt: str | None = None) -> None:
        h = msg.headers
        if self.version == "1.2":
            self.conn.nack(h["ack"], receipt=receipt)
        else:
            self.conn.nack(h["message-id"], h["subscription"], receipt=receipt)

    def frame(self, command: str, **headers: str) -> None:
        """BEGIN/COMMIT/ABORT with a receipt, waited for."""
        r = self.rid()
        self.conn.send_frame(command, {**headers, "receipt": r})
        self.rec.wait_receipt(r)

    def close(self) -> None:
        try:
            if self.conn.is_connected():
                self.conn.disconnect()
        except stomp.exception.StompException:
            pass
        self.conn.transport.stop()


@pytest.fixture
def clients() -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(port: int, version: str = "1.2", **kw: Any) -> Client:
        c = Client(port, version, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def bodies(msgs: list[Any]) -> list[bytes]:
    return [m.body for m in msgs]


def native_drain(url: str, queue: str, expect: int, timeout: float = 5.0) -> list[tandem.ReceivedMessage]:
    """Receive `expect` messages from `queue` with the native client, then check nothing else is there."""
    out = []
    with tandem.connect(url) as conn:
        consumer = conn.session().create_consumer(queue)
        for _ in range(expect):
            m = consumer.receive(timeout)
            assert m is not None, f"only {len(out)} of {expect} messages on {queue!r}"
            out.append(m)
        assert consumer.receive(0.3) is None, f"more than {expect} messages on {queue!r}"
    return out


# --------------------------------------------------------------------------- raw socket side


class Raw:
    """A STOMP connection over a plain socket: bytes out, frames (parsed by the codec) in."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.parser = StompParser(1 << 24, "1.0", SERVER_COMMANDS)
        self.pending: deque[Frame] = deque()
        self.raw = bytearray()
        self.eof = False
        self.eof_at: float | None = None
        self.skipped: list[Frame] = []  # frames passed over by next_of()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, version: str = "1.2", **headers: str) -> Frame:
        lines = ["CONNECT", "host:localhost"]
        if version != "1.0":
            lines.append(f"accept-version:{version}")
        lines += [f"{k}:{v}" for k, v in headers.items()]
        self.send(("\n".join(lines) + "\n\n\0").encode())
        frame = self.next()
        assert frame is not None and frame.command == "CONNECTED", frame
        assert frame.headers["version"] == version
        self.parser.version = version
        return frame

    def _fill(self, deadline: float) -> bool:
        """Read once; False at EOF. Raises AssertionError at the deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out; received so far: {bytes(self.raw[-400:])!r}")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"timed out; received so far: {bytes(self.raw[-400:])!r}") from None
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            self.eof_at = time.monotonic()
            return False
        self.raw += chunk
        self.pending.extend(self.parser.feed(chunk))
        return True

    def next(self, timeout: float = 5.0) -> Frame | None:
        """The next frame, or None once the server has closed the connection."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            if self.eof or not self._fill(deadline):
                return None
        return self.pending.popleft()

    def next_of(self, command: str, timeout: float = 5.0, **headers: str) -> Frame:
        """The next frame with this command (and these headers); others are kept in `skipped`."""
        deadline = time.monotonic() + timeout
        while True:
            f = self.next(max(0.0, deadline - time.monotonic()))
            assert f is not None, f"connection closed while waiting for {command} {headers}: {bytes(self.raw)!r}"
            if f.command == command and all(f.headers.get(k) == v for k, v in headers.items()):
                return f
            self.skipped.append(f)

    def messages(self, n: int) -> list[Frame]:
        """n MESSAGE frames: those passed over by next_of() first."""
        out = [f for f in self.skipped if f.command == "MESSAGE"][:n]
        self.skipped = [f for f in self.skipped if not any(f is m for m in out)]
        while len(out) < n:
            out.append(self.next_of("MESSAGE"))
        return out

    def until_closed(self, timeout: float = 5.0) -> list[Frame]:
        """All frames up to the server closing the connection (which must happen within `timeout`)."""
        deadline = time.monotonic() + timeout
        frames = []
        while True:
            while self.pending:
                frames.append(self.pending.popleft())
            if self.eof or not self._fill(deadline):
                frames.extend(self.pending)
                self.pending.clear()
                return frames

    def quiet(self, seconds: float) -> list[Frame]:
        """Frames arriving within `seconds` (the connection must stay open)."""
        deadline = time.monotonic() + seconds
        frames = list(self.pending)
        self.pending.clear()
        while True:
            try:
                alive = self._fill(deadline)
            except AssertionError:
                break
            assert alive, "the server closed the connection"
            frames.extend(self.pending)
            self.pending.clear()
        return frames

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raws() -> Iterator[Callable[[int], Raw]]:
    made: list[Raw] = []

    def make(port: int) -> Raw:
        r = Raw(port)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def assert_error_then_closed(raw: Raw, words: str | None = None, timeout: float = 5.0) -> Frame:
    frames = raw.until_closed(timeout)
    errors = [f for f in frames if f.command == "ERROR"]
    assert len(errors) == 1, f"expected one ERROR frame, got {frames}"
    assert frames[-1] is errors[0], f"ERROR must be the last frame: {frames}"
    error = errors[0]
    assert error.headers.get("message"), f"ERROR without a message header: {error}"
    if words is not None:
        assert re.search(words, error.headers["message"], re.IGNORECASE), error.headers["message"]
    assert raw.eof
    return error


# ============================================================================ send / receive


@pytest.mark.parametrize("version", VERSIONS)
def test_queue_send_and_receive(sb: BrokerProcess, clients: Callable[..., Client], version: str) -> None:
    c = clients(sb.ports["stomp"], version)
    assert c.rec.connected["version"] == version
    q = f"/queue/basic-{version}"
    for i in range(3):
        c.send(q, f"m{i}", **{"x-custom": f"v{i}"})
    c.subscribe(q, "sub-1")
    msgs = c.rec.wait_messages(3)
    assert bodies(msgs) == [b"m0", b"m1", b"m2"]
    ids = set()
    for i, m in enumerate(msgs):
        assert m.headers["destination"] == q
        assert m.headers["subscription"] == "sub-1"
        assert m.headers["x-custom"] == f"v{i}"
        assert m.headers["content-length"] == "2"
        assert "redelivered" not in m.headers
        assert ("ack" in m.headers) is False  # auto mode: nothing to ack
        ids.add(m.headers["message-id"])
    assert len(ids) == 3
    assert c.rec.quiet(0.3) == msgs  # each message once
    assert not c.rec.errors


def test_queue_is_anycast_between_subscribers(sb: BrokerProcess, clients: Callable[..., Client]) -> None:
    port = sb.ports["stomp"]
    a, b, producer = clients(port), clients(port, "1.1"), clients(port, "1.0")
    a.subscribe("/queue/shared-work", "a")
    b.subscribe("/queue/shared-work", "b")
    sent = [f"job-{i}".encode() for i in range(20)]
    for body in sent:
        producer.send("/queue/shared-work", body, wait=False)
    assert a.rec.wait_for(lambda: len(a.rec.messages) + len(b.rec.messages) >= 20)
    a.rec.quiet(0.3)
    got_a, got_b = bodies(a.rec.messages), bodies(b.rec.messages)
    assert sorted(got_a + got_b) == sorted(sent)  # every message exactly once
    assert got_a and got_b  # both took part
    assert got_a == [x for x in sent if x in got_a]  # each in order


def test_topic_every_subscriber_gets_each_message(sb: BrokerProcess, clients: Callable[..., Client]) -> None:
    port = sb.ports["stomp"]
    producer = clients(port)
    producer.send("/topic/news", "before anyone listened")
    subs = [clients(port, v) for v in VERSIONS]
    for i, s in enumerate(subs):
        s.subscribe("/topic/news", f"t{i}")
    for i in range(5):
        producer.send("/topic/news", f"n{i}", wait=False)
    expected = [f"n{i}".encode() for i in range(5)]
    for s in subs:
        msgs = s.rec.wait_messages(5)
        assert bodies(msgs) == expected
        assert {m.headers["destination"] for m in msgs} == {"/topic/news"}
    # an unsubscribed subscriber stops receiving; the others go on
    subs[0].unsubscribe("t0")
    producer.send("/topic/news", "after")
    for s in subs[1:]:
        assert bodies(s.rec.wait_messages(6))[-1] == b"after"
    assert bodies(subs[0].rec.quiet(0.3)) == expected
    # a topic is not a queue: nothing was kept for late subscribers
    late = clients(port)
    late.subscribe("/topic/news", "late")
    assert late.rec.quiet(0.3) == []


# ================================================================================= ack modes


def _reconnect_and_collect(port: int, clients: Callable[..., Client], queue: str, version: str = "1.2") -> list[Any]:
    """A new subscriber on `queue`: what it gets, up to a marker sent after subscribing."""
    c = clients(port, version)
    c.subscribe(queue, "again", ack="client-individual")
    c.send(queue, "marker")
    assert c.rec.wait_for(lambda: any(m.body == b"marker" for m in c.rec.messages))
    msgs = c.rec.quiet(0.2)
    return [m for m in msgs if m.body != b"marker"]


@pytest.mark.parametrize("version", VERSIONS)
def test_ack_auto_acknowledges_on_delivery(sb: BrokerProcess, clients: Callable[..., Client], version: str) -> None:
    port = sb.ports["stomp"]
    c = clients(port, version)
    for i in range(3):
        c.send("/queue/auto", f"a{i}")
    c.subscribe("/queue/auto", "s", ack="auto")
    assert bodies(c.rec.wait_messages(3)) == [b"a0", b"a1", b"a2"]
    c.close()
    assert _reconnect_and_collect(port, clients, "/queue/auto") == []


@pytest.mark.parametrize("version", VERSIONS)
def test_ack_client_is_cumulative(sb: BrokerProcess, clients: Callable[..., Client], version: str) -> None:
    port = sb.ports["stomp"]
    c = clients(port, version)
    for i in range(5):
        c.send("/queue/cumulative", f"c{i}")
    c.subscribe("/queue/cumulative", "s", ack="client")
    msgs = c.rec.wait_messages(5)
    if version == "1.2":
        assert len({m.headers["ack"] for m in msgs}) == 5
    r = c.rid()
    c.ack(msgs[2], receipt=r)  # covers c0, c1, c2
    c.rec.wait_receipt(r)
    c.close()
    again = _reconnect_and_collect(port, clients, "/queue/cumulative")
    assert bodies(again) == [b"c3", b"c4"]
    assert all(m.headers.get("redelivered") == "true" for m in again)


@pytest.mark.parametrize("version", VERSIONS)
def test_ack_client_individual(sb: BrokerProcess, clients: Callable[..., Client], version: str) -> None:
    port = sb.ports["stomp"]
    c = clients(port, version)
    for i in range(5):
        c.send("/queue/individual", f"i{i}")
    c.subscribe("/queue/individual", "s", ack="client-individual")
    msgs = c.rec.wait_messages(5)
    r = c.rid()
    c.ack(msgs[1])
    c.ack(msgs[3], receipt=r)
    c.rec.wait_receipt(r)
    c.close()
    again = _reconnect_and_collect(port, clients, "/queue/individual")
    assert bodies(again) == [b"i0", b"i2", b"i4"]
    assert all(m.headers.get("redelivered") == "true" for m in again)


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_nack_redelivers_then_dead_letters(
    broker_factory: Factory, clients: Callable[..., Client], version: str
) -> None:
    b = stomp_broker(broker_factory, address_settings={"#": {"dead-letter-address": "DLQ", "max-delivery-attempts": 2}})
    c = clients(b.ports["stomp"], version)
    c.send("/queue/work", b"poison\x00pill", persistent="true", **{"x-k": "kept"})
    c.send("/queue/work", "good")
    c.subscribe("/queue/work", "w", ack="client-individual")
    first = c.rec.take(2)
    assert bodies(first) == [b"poison\x00pill", b"good"]
    assert "redelivered" not in first[0].headers
    c.ack(first[1])
    r = c.rid()
    c.nack(first[0], receipt=r)
    c.rec.wait_receipt(r)
    (second,) = c.rec.take(1)
    assert second.body == b"poison\x00pill"
    assert second.headers["redelivered"] == "true"
    r = c.rid()
    c.nack(second, receipt=r)  # the second failed delivery: dead-lettered
    c.rec.wait_receipt(r)
    assert c.rec.quiet(0.4) == []
    (dead,) = native_drain(b.url, "DLQ", 1)
    assert dead.body == b"poison\x00pill"
    assert dead.properties["x-k"] == "kept"
    assert dead.properties["_AMQ_ORIG_ADDRESS"] == "work"
    assert dead.durable
    assert native_drain(b.url, "work", 0) == []


def test_nack_dead_letter_seen_by_a_stomp_subscriber_on_the_dlq(
    broker_factory: Factory, clients: Callable[..., Client]
) -> None:
    b = stomp_broker(broker_factory, address_settings={"#": {"dead-letter-address": "DLQ", "max-delivery-attempts": 2}})
    c = clients(b.ports["stomp"])
    dlq = clients(b.ports["stomp"])
    dlq.subscribe("/queue/DLQ", "dead")
    c.send("/queue/work2", "bad")
    c.subscribe("/queue/work2", "w", ack="client-individual")
    for _ in range(2):
        (m,) = c.rec.take(1)
        c.nack(m)
    (dead,) = dlq.rec.wait_messages(1)
    assert dead.body == b"bad"
    assert dead.headers["destination"] == "/queue/DLQ"
    assert dead.headers["_AMQ_ORIG_ADDRESS"] == "work2"


# ============================================================================== transactions


def test_transaction_commit_and_abort_cover_sends(sb: BrokerProcess, clients: Callable[..., Client]) -> None:
    port = sb.ports["stomp"]
    producer, consumer = clients(port), clients(port, "1.1")
    consumer.subscribe("/queue/txq", "c")
    producer.frame("BEGIN", transaction="t1")
    producer.send("/queue/txq", "a", transaction="t1")
    producer.send("/queue/txq", "b", transaction="t1", persistent="true")
    assert consumer.rec.quiet(0.4) == []  # not before COMMIT
    producer.frame("COMMIT", transaction="t1")
    assert bodies(consumer.rec.take(2)) == [b"a", b"b"]

    producer.frame("BEGIN", transaction="t2")
    producer.send("/queue/txq", "aborted", transaction="t2")
    producer.frame("ABORT", transaction="t2")
    producer.send("/queue/txq", "after")
    assert bodies(consumer.rec.take(1)) == [b"after"]
    assert consumer.rec.quiet(0.3) == []
    # the transaction name is free again, and an ended transaction is unknown
    producer.frame("BEGIN", transaction="t1")
    producer.frame("ABORT", transaction="t1")


def test_transaction_commit_and_abort_cover_acks(sb: BrokerProcess, clients: Callable[..., Client]) -> None:
    port = sb.ports["stomp"]
    c = clients(port)
    c.send("/queue/txacks", "x", persistent="true")
    c.subscribe("/queue/txacks", "s", ack="client-individual")
    (m,) = c.rec.take(1)
    c.frame("BEGIN", transaction="ta")
    c.ack(m, transaction="ta")
    c.frame("ABORT", transaction="ta")  # the ack is undone: the message comes back
    (again,) = c.rec.take(1)
    assert again.body == b"x"
    assert again.headers["redelivered"] == "true"
    c.frame("BEGIN", transaction="tb")
    c.ack(again, transaction="tb")
    c.frame("COMMIT", transaction="tb")
    assert c.rec.quiet(0.3) == []
    c.close()
    assert _reconnect_and_collect(port, clients, "/queue/txacks") == []


def test_disconnect_with_an_open_transaction_drops_its_sends(sb: BrokerProcess, clients: Callable[..., Client]) -> None:
    port = sb.ports["stomp"]
    p = clients(port)
    p.frame("BEGIN", transaction="open")
    p.send("/queue/opentx", "never", transaction="open")
    p.close()
    assert _reconnect_and_collect(port, clients, "/queue/opentx") == []


def test_transactions_paged_while_open_commit_abort_and_disconnect(
    broker_factory: Factory, clients: Callable[..., Client]
) -> None:
    """Decision 0055 through STOMP: two transactions of one connection paged as they arrive
    (more than the address's max-size-bytes each): ABORT deletes one's files, COMMIT delivers
    the other's messages in order, a disconnect drops a third's; no file of them is left."""
    b = stomp_broker(
        broker_factory,
        address_settings={"pg.#": {"max-size-bytes": 16 * 1024, "address-full-policy": "PAGE"}},
    )
    port = b.ports["stomp"]
    p = clients(port)
    for i in range(100):  # the address pages
        p.send("/queue/pg.q", f"m{i:04d}", wait=i == 99, persistent="true")
    body = "x" * 1000
    p.frame("BEGIN", transaction="keep")
    p.frame("BEGIN", transaction="drop")
    for i in range(100, 200):
        p.send("/queue/pg.q", f"m{i:04d}" + body, wait=False, transaction="keep", persistent="true")
        p.send("/queue/pg.q", f"d{i:04d}" + body, wait=i == 199, transaction="drop", persistent="true")
    paging = Path(b.data_dir) / "paging"

    def tx_files() -> int:
        return len([f for f in paging.iterdir() if "-t" in f.name])

    deadline = time.monotonic() + 10  # the page writer creates them in batches of its own
    while tx_files() < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tx_files() == 2  # one file per transaction
    p.frame("ABORT", transaction="drop")
    p.frame("COMMIT", transaction="keep")
    q = clients(port)
    q.frame("BEGIN", transaction="gone")
    q.send("/queue/pg.q", "never" + body * 20, transaction="gone", persistent="true")
    q.close()
    got = [m.body[:5].decode() for m in native_drain(b.url, "pg.q", 200)]
    assert got == [f"m{i:04d}" for i in range(200)]
    deadline = time.monotonic() + 5
    while [f for f in paging.iterdir() if "-t" in f.name] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [f.name for f in paging.iterdir() if "-t" in f.name]


# ================================================================================== receipts


def test_every_frame_with_a_receipt_header_gets_a_receipt(sb: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    r = raws(sb.ports["stomp"])
    r.connect("1.2")

    def step(frame: bytes, rid: str) -> None:
        r.send(frame)
        r.next_of("RECEIPT", **{"receipt-id": rid})

    step(b"SUBSCRIBE\nid:s\ndestination:/queue/rc\nack:client-individual\nreceipt:sub\n\n\0", "sub")
    step(b"SEND\ndestination:/queue/rc\npersistent:true\nreceipt:send-durable\n\none\0", "send-durable")
    step(b"SEND\ndestination:/queue/rc\nreceipt:send\n\ntwo\0", "send")
    one, two = r.messages(2)
    assert (one.body, two.body) == (b"one", b"two")
    step(f"ACK\nid:{one.headers['ack']}\nreceipt:ack\n\n\0".encode(), "ack")
    step(f"NACK\nid:{two.headers['ack']}\nreceipt:nack\n\n\0".encode(), "nack")
    (back,) = r.messages(1)
    assert back.body == b"two" and back.headers["redelivered"] == "true"
    step(b"BEGIN\ntransaction:t\nreceipt:begin\n\n\0", "begin")
    step(f"ACK\nid:{back.headers['ack']}\ntransaction:t\nreceipt:ack-tx\n\n\0".encode(), "ack-tx")
    step(b"SEND\ndestination:/queue/rc\ntransaction:t\nreceipt:send-tx\n\nthree\0", "send-tx")
    step(b"COMMIT\ntransaction:t\nreceipt:commit\n\n\0", "commit")
    step(b"BEGIN\ntransaction:t2\nreceipt:begin2\n\n\0", "begin2")
    step(b"ABORT\ntransaction:t2\nreceipt:abort\n\n\0", "abort")
    step(b"UNSUBSCRIBE\nid:s\nreceipt:unsub\n\n\0", "unsub")
    r.send(b"DISCONNECT\nreceipt:bye\n\n\0")
    frames = r.until_closed()
    assert [f.headers.get("receipt-id") for f in frames if f.command == "RECEIPT"] == ["bye"]
    assert not [f for f in r.skipped + frames if f.command == "ERROR"]


def test_receipts_of_pipelined_frames_come_in_order(sb: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    r = raws(sb.ports["stomp"])
    r.connect("1.2")
    ids = [f"p{i}" for i in range(8)]
    r.send(
        f"SUBSCRIBE\nid:s\ndestination:/queue/pipe\nreceipt:{ids[0]}\n\n\0"
        f"SEND\ndestination:/queue/pipe\npersistent:true\nreceipt:{ids[1]}\n\na\0"
        f"SEND\ndestination:/queue/pipe\nreceipt:{ids[2]}\n\nb\0"
        f"BEGIN\ntransaction:t\nreceipt:{ids[3]}\n\n\0"
        f"SEND\ndestination:/queue/pipe\ntransaction:t\npersistent:true\nreceipt:{ids[4]}\n\nc\0"
        f"COMMIT\ntransaction:t\nreceipt:{ids[5]}\n\n\0"
        f"SEND\ndestination:/queue/pipe\nreceipt:{ids[6]}\n\nd\0"
        f"UNSUBSCRIBE\nid:s\nreceipt:{ids[7]}\n\n\0".encode()
    )
    got = [r.next_of("RECEIPT").headers["receipt-id"] for _ in ids]
    assert got == ids


def test_disconnect_receipt_comes_after_the_receipts_of_frames_in_the_same_packet(
    sb: BrokerProcess, raws: Callable[[int], Raw]
) -> None:
    """RECEIPT for every frame with a receipt header — also when DISCONNECT arrives in the same read."""
    r = raws(sb.ports["stomp"])
    r.connect("1.2")
    r.send(
        b"SUBSCRIBE\nid:s\ndestination:/queue/bye\nreceipt:r-sub\n\n\0"
        b"SEND\ndestination:/queue/elsewhere\npersistent:true\nreceipt:r-durable\n\nx\0"
        b"SEND\ndestination:/queue/elsewhere\nreceipt:r-plain\n\ny\0"
        b"DISCONNECT\nreceipt:r-bye\n\n\0"
    )
    frames = r.until_closed()
    receipts = [f.headers["receipt-id"] for f in frames if f.command == "RECEIPT"]
    assert receipts == ["r-sub", "r-durable", "r-plain", "r-bye"]


def test_durable_send_receipt_means_stored(broker_factory: Factory, clients: Callable[..., Client]) -> None:
    """SIGKILL right after the RECEIPTs: every receipted durable SEND and COMMIT survives."""
    b = stomp_broker(broker_factory)
    c = clients(b.ports["stomp"])
    rids = [c.send("/queue/stored", f"s{i}", wait=False, persistent="true") for i in range(30)]
    c.conn.begin("tx")
    for i in range(10):
        c.conn.send("/queue/stored-tx", f"t{i}", headers={"persistent": "true", "transaction": "tx"})
    commit = c.rid()
    c.conn.commit("tx", receipt=commit)
    c.send("/queue/not-durable", "gone")
    for rid in [*rids, commit]:
        c.rec.wait_receipt(rid)
    b.kill()
    c.close()
    b.start()
    assert [m.body for m in native_drain(b.url, "stored", 30)] == [f"s{i}".encode() for i in range(30)]
    assert [m.body for m in native_drain(b.url, "stored-tx", 10)] == [f"t{i}".encode() for i in range(10)]
    assert native_drain(b.url, "not-durable", 0) == []  # a non-persistent message does not outlive the process


def test_durable_ack_receipt_means_stored(broker_factory: Factory, clients: Callable[..., Client]) -> None:
    b = stomp_broker(broker_factory)
    c = clients(b.ports["stomp"])
    for i in range(5):
        c.send("/queue/acked", f"k{i}", persistent="true")
    c.subscribe("/queue/acked", "s", ack="client-individual")
    msgs = c.rec.wait_messages(5)
    r1, r2 = c.rid(), c.rid()
    c.ack(msgs[0], receipt=r1)
    c.ack(msgs[2], receipt=r2)
    c.rec.wait_receipt(r1)
    c.rec.wait_receipt(r2)
    b.kill()
    c.close()
    b.start()
    assert [m.body for m in native_drain(b.url, "acked", 3)] == [b"k1", b"k3", b"k4"]


def _pipelined_acks(r: Raw, dest: str, n: int) -> list[Frame]:
    """Send n persistent messages and subscribe client-individual; the n MESSAGE frames."""
    for i in range(n):
        r.send(f"SEND\ndestination:{dest}\npersistent:true\nreceipt:s{i}\n\nm{i}\0".encode())
    r.next_of("RECEIPT", **{"receipt-id": f"s{n - 1}"})
    r.send(f"SUBSCRIBE\nid:s\ndestination:{dest}\nack:client-individual\n\n\0".encode())
    return r.messages(n)


def _ack(m: Frame, receipt: str | None = None) -> bytes:
    extra = f"receipt:{receipt}\n" if receipt else ""
    return f"ACK\nid:{m.headers['ack']}\n{extra}\n\0".encode()


def test_acks_pipelined_in_one_packet_survive_a_kill(broker_factory: Factory, raws: Callable[[int], Raw]) -> None:
    """ACKs that arrive together are journaled together: the receipt of the last one covers all."""
    b = stomp_broker(broker_factory)
    r = raws(b.ports["stomp"])
    r.connect("1.2")
    msgs = _pipelined_acks(r, "/queue/acked-together", 8)
    r.send(b"".join(_ack(m) for m in msgs[:5]) + _ack(msgs[6], receipt="last"))
    r.next_of("RECEIPT", **{"receipt-id": "last"})
    b.kill()
    b.start()
    assert [m.body for m in native_drain(b.url, "acked-together", 2)] == [b"m5", b"m7"]


@pytest.mark.parametrize("packets", ["one", "two"])
def test_a_receipt_comes_once_the_plain_acks_before_it_are_on_disk(
    broker_factory: Factory, raws: Callable[[int], Raw], packets: str
) -> None:
    """A plain ACK of a persistent message, then an ACK with a receipt that writes nothing itself
    (its message is not persistent), in one packet or the next: the RECEIPT says that ACK and
    every ACK before it are on disk (docs/stomp.md), so a kill -9 right after it must not bring
    the first message back. The message journal's syncs are slowed to 2 s (the fault seam), so
    a receipt that does not wait for them arrives long before they are done."""
    b = stomp_broker(broker_factory, env={FAULTS_ENV: "tandem-data:sync=delay2"})
    r = raws(b.ports["stomp"])
    r.connect("1.2")
    r.send(
        b"SEND\ndestination:/queue/acks-then-receipt\npersistent:true\nreceipt:stored\n\nkept\0"
        b"SEND\ndestination:/queue/acks-then-receipt\npersistent:false\nreceipt:sent\n\npassing\0"
    )
    r.next_of("RECEIPT", **{"receipt-id": "stored"}, timeout=15)  # "kept" is on disk
    r.next_of("RECEIPT", **{"receipt-id": "sent"})
    r.send(b"SUBSCRIBE\nid:s\ndestination:/queue/acks-then-receipt\nack:client-individual\n\n\0")
    kept, passing = r.messages(2)
    assert (kept.body, passing.body) == (b"kept", b"passing")
    if packets == "one":
        r.send(_ack(kept) + _ack(passing, receipt="acked"))
    else:
        r.send(_ack(kept))
        time.sleep(0.3)  # the broker has read it, and journaled it: not synced yet
        r.send(_ack(passing, receipt="acked"))
    r.next_of("RECEIPT", **{"receipt-id": "acked"}, timeout=15)
    b.kill()
    b.start()
    assert native_drain(b.url, "acks-then-receipt", 0) == []  # "kept" was acknowledged for good


def _sync_then_kill_and_restart(b: BrokerProcess) -> None:
    """A confirmed durable send after everything else: its fsync covers every earlier record."""
    with tandem.connect(b.url) as conn, conn.session() as s:
        s.create_producer("sync-marker").send(b"sync")  # durable by default
    b.kill()
    b.start()


def test_acks_before_a_bad_frame_in_the_same_packet_stand(sb: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    r = raws(sb.ports["stomp"])
    r.connect("1.2")
    msgs = _pipelined_acks(r, "/queue/acked-then-junk", 4)
    r.send(_ack(msgs[0]) + _ack(msgs[2]) + b"FROB\n\n\0")
    assert_error_then_closed(r, "unknown command")
    _sync_then_kill_and_restart(sb)
    assert [m.body for m in native_drain(sb.url, "acked-then-junk", 2)] == [b"m1", b"m3"]


def test_an_ack_repeated_in_the_same_packet_gets_an_error(sb: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    """The first ACK stands (journaled before the connection closes), the second is an error."""
    r = raws(sb.ports["stomp"])
    r.connect("1.2")
    msgs = _pipelined_acks(r, "/queue/acked-twice", 3)
    # The frame after the bad one is never handled: the first ACK must not wait for it.
    r.send(_ack(msgs[1]) + _ack(msgs[1]) + b"SEND\ndestination:/queue/after-dup\n\nx\0")
    assert_error_then_closed(r, "not awaiting an ack")
    _sync_then_kill_and_restart(sb)
    assert [m.body for m in native_drain(sb.url, "acked-twice", 2)] == [b"m0", b"m2"]


@pytest.mark.parametrize(
    ("ack_id", "words"),
    [
        ("{cid}.\u00b2", "unknown ack id"),  # a digit to str.isdigit, not to int()
        ("{cid}.987654", "not awaiting an ack"),
        ("{cid}.", "unknown ack id"),
        ("0{cid}.{mid}", None),  # not as the broker wrote it, but the same consumer and message
    ],
    ids=["superscript-digit", "unknown-message", "no-message-id", "leading-zero"],
)
def test_ack_ids_of_a_live_subscription(
    sb: BrokerProcess, raws: Callable[[int], Raw], ack_id: str, words: str | None, request: pytest.FixtureRequest
) -> None:
    """ACK ids that start with a live consumer's id are still checked: an error, or the same ack."""
    r = raws(sb.ports["stomp"])
    r.connect("1.2")
    dest = f"/queue/ack-ids-{request.node.callspec.id}"
    msgs = _pipelined_acks(r, dest, 2)
    cid, _, mid = msgs[0].headers["ack"].partition(".")
    r.send(f"ACK\nid:{ack_id.format(cid=cid, mid=mid)}\nreceipt:a\n\n\0".encode())
    if words is not None:
        assert_error_then_closed(r, words)
        _sync_then_kill_and_restart(sb)
        assert [m.body for m in native_drain(sb.url, dest[7:], 2)] == [b"m0", b"m1"]
    else:
        r.next_of("RECEIPT", **{"receipt-id": "a"})
        _sync_then_kill_and_restart(sb)
        assert [m.body for m in native_drain(sb.url, dest[7:], 1)] == [b"m1"]


def test_a_long_pipelined_burst_is_handled_in_order_up_to_a_bad_frame(
    sb: BrokerProcess, raws: Callable[[int], Raw]
) -> None:
    """300 SENDs in one write (the broker handles a read in slices of 128 frames) then a bad
    frame: every SEND is receipted in order and kept, then the ERROR comes."""
    r = raws(sb.ports["stomp"])
    r.connect("1.2")
    n = 300
    r.send(
        b"".join(f"SEND\ndestination:/queue/sliced\npersistent:true\nreceipt:r{i}\n\nm{i}\0".encode() for i in range(n))
        + b"FROB\n\n\0"
    )
    receipts = [r.next_of("RECEIPT").headers["receipt-id"] for _ in range(n)]
    assert receipts == [f"r{i}" for i in range(n)]
    assert_error_then_closed(r, "unknown command")
    assert [m.body for m in native_drain(sb.url, "sliced", n)] == [f"m{i}".encode() for i in range(n)]


# ================================================================================ heart-beats


@pytest.mark.parametrize(
    "settings", [{}, {"connection_check_period": 20}], ids=["default-settings", "check-every-20ms"]
)
def test_stomp_py_heartbeats_both_ways(
    broker_factory: Factory, clients: Callable[..., Client], settings: dict[str, Any]
) -> None:
    b = stomp_broker(broker_factory, **settings)
    c = clients(b.ports["stomp"], heartbeats=(100, 100))
    assert c.rec.connected["heart-beat"] == "100,100"
    c.rec.wait_for(lambda: c.rec.heartbeat_timeouts > 0, 1.5)
    assert c.rec.heartbeats >= 5, c.rec.heartbeats  # the server beats about every 100 ms
    assert c.rec.heartbeat_timeouts == 0
    assert c.conn.is_connected()  # and it took stomp.py's beats as signs of life
    c.subscribe("/queue/hb", "s")
    c.send("/queue/hb", "alive")
    assert bodies(c.rec.wait_messages(1)) == [b"alive"]


def test_server_heartbeats_at_the_interval_the_client_asked_for(sb: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    """Default settings: a client asking for a beat every 100 ms must get them (not every connection-check-period)."""
    r = raws(sb.ports["stomp"])
    connected = r.connect("1.2", **{"heart-beat": "0,100"})
    assert connected.headers["heart-beat"] == "100,0"
    start = len(r.raw)
    r.quiet(1.5)
    beats = r.raw[start:].count(b"\n")
    assert beats >= 5, f"{beats} heart-beats in 1.5 s, asked for one every 100 ms"


def _silent_clients_are_closed(port: int, raws: Callable[[int], Raw], stagger: list[float]) -> None:
    """Clients announcing beats every 100 ms beat for a while, then fall silent at staggered times:
    each must get an ERROR and be closed about 2x100 ms later (well within 1.5 s), never while it beats."""
    conns = [raws(port) for _ in stagger]
    for r in conns:
        assert r.connect("1.2", **{"heart-beat": "100,100"}).headers["heart-beat"] == "100,100"
    t0 = time.monotonic()
    stop_at = [t0 + 0.7 + s for s in stagger]
    silent_since: list[float | None] = [None] * len(conns)
    deadline = t0 + 0.7 + max(stagger) + 4.0
    while time.monotonic() < deadline and not all(r.eof for r in conns):
        now = time.monotonic()
        for i, r in enumerate(conns):
            if r.eof:
                continue
            if now < stop_at[i]:
                try:
                    r.send(b"\n")
                except OSError:
                    pass  # closed under us: the checks below say so
            elif silent_since[i] is None:
                silent_since[i] = now
        readable, _, _ = select.select([r.sock for r in conns if not r.eof], [], [], 0.04)
        for r in conns:
            if r.sock in readable:
                r._fill(time.monotonic() + 1)
    for i, r in enumerate(conns):
        assert r.eof, f"client {i} silent since {silent_since[i]} was never closed"
        assert r.eof_at is not None and silent_since[i] is not None
        assert r.eof_at >= stop_at[i], f"client {i} was closed while it was still beating"
        lag = r.eof_at - silent_since[i]
        assert 0.15 <= lag <= 1.5, f"client {i} closed {lag:.2f}s after falling silent (announced 100 ms beats)"
        errors = [f for f in r.pending if f.command == "ERROR"]
        assert len(errors) == 1 and errors[0].headers.get("message"), list(r.pending)


def test_silent_client_is_closed_after_twice_its_heartbeat(broker_factory: Factory, raws: Callable[[int], Raw]) -> None:
    b = stomp_broker(broker_factory, connection_check_period=20)
    _silent_clients_are_closed(b.ports["stomp"], raws, [0.0])


def test_silent_client_is_closed_after_twice_its_heartbeat_with_default_settings(
    sb: BrokerProcess, raws: Callable[[int], Raw]
) -> None:
    """Four clients falling silent 0.5 s apart: with default settings every one must be closed within 1.5 s."""
    _silent_clients_are_closed(sb.ports["stomp"], raws, [0.0, 0.5, 1.0, 1.5])


# ==================================================================== durable subscriptions


def test_durable_subscription_survives_absence_and_restart(
    broker_factory: Factory, clients: Callable[..., Client]
) -> None:
    b = stomp_broker(broker_factory)
    port = b.ports["stomp"]
    ident = {"client-id": "reader-1"}

    def subscriber() -> Client:
        c = clients(port, headers=ident)
        c.subscribe("/topic/events", "d", ack="client-individual", **{"durable-subscription-name": "mine"})
        return c

    c = subscriber()
    volatile = clients(port)
    volatile.subscribe("/topic/events", "v")
    producer = clients(port)
    producer.send("/topic/events", "e0", persistent="true")
    (m,) = c.rec.take(1)
    assert m.body == b"e0"
    c.ack(m)
    c.close()
    volatile.close()
    for i in (1, 2):  # while the subscriber is away
        producer.send("/topic/events", f"e{i}", persistent="true")
    c = subscriber()
    msgs = c.rec.take(2)
    assert bodies(msgs) == [b"e1", b"e2"]
    for m in msgs:
        c.ack(m)
    c.close()
    for i in (3, 4):
        producer.send("/topic/events", f"e{i}", persistent="true")
    producer.close()
    b.stop()
    b.start()
    port = b.ports["stomp"]
    c = subscriber()
    assert bodies(c.rec.take(2)) == [b"e3", b"e4"]
    assert c.rec.quiet(0.3) == []
    # a non-durable subscriber on the same topic starts empty
    late = clients(port)
    late.subscribe("/topic/events", "late")
    assert late.rec.quiet(0.2) == []


def test_durable_subscription_survives_a_kill(broker_factory: Factory, clients: Callable[..., Client]) -> None:
    b = stomp_broker(broker_factory)
    ident = {"client-id": "reader-2"}
    c = clients(b.ports["stomp"], headers=ident)
    c.subscribe("/topic/ticks", "d", **{"durable-subscription-name": "ticks"})
    c.close()
    p = clients(b.ports["stomp"])
    for i in range(3):
        p.send("/topic/ticks", f"k{i}", persistent="true")
    b.kill()
    p.close()
    b.start()
    c = clients(b.ports["stomp"], headers=ident)
    c.subscribe("/topic/ticks", "d", **{"durable-subscription-name": "ticks"})
    assert bodies(c.rec.wait_messages(3)) == [b"k0", b"k1", b"k2"]


def test_unsubscribe_with_durable_name_ends_the_subscription(sb: BrokerProcess, clients: Callable[..., Client]) -> None:
    port = sb.ports["stomp"]
    ident = {"client-id": "reader-3"}
    c = clients(port, headers=ident)
    c.subscribe("/topic/ended", "d", **{"durable-subscription-name": "gone"})
    c.unsubscribe("d", **{"durable-subscription-name": "gone"})
    c.close()
    p = clients(port)
    p.send("/topic/ended", "lost", persistent="true")
    c = clients(port, headers=ident)
    c.subscribe("/topic/ended", "d", **{"durable-subscription-name": "gone"})
    assert c.rec.quiet(0.4) == []


# ================================================================================= selectors


def test_selector_on_a_queue_and_on_a_topic(sb: BrokerProcess, clients: Callable[..., Client]) -> None:
    port = sb.ports["stomp"]
    red, anyone, topic_red = clients(port), clients(port, "1.1"), clients(port, "1.0")
    red.subscribe("/queue/paint", "r", selector="color = 'red'")
    topic_red.subscribe("/topic/paint", "tr", selector="color = 'red' AND size <> 'xl'")
    p = clients(port)
    for i, color in enumerate(["red", "blue", "red", "green"]):
        p.send("/queue/paint", f"{color}-{i}", color=color)
        p.send("/topic/paint", f"{color}-{i}", color=color, size="xl" if i == 2 else "s")
    assert bodies(red.rec.wait_messages(2)) == [b"red-0", b"red-2"]
    assert bodies(topic_red.rec.wait_messages(1)) == [b"red-0"]
    anyone.subscribe("/queue/paint", "a")  # what the selector left behind
    assert bodies(anyone.rec.wait_messages(2)) == [b"blue-1", b"green-3"]
    assert len(red.rec.quiet(0.3)) == 2
    assert len(topic_red.rec.messages) == 1


def test_topic_subscriptions_with_selectors_keep_no_unmatched_messages(
    sb: BrokerProcess, clients: Callable[..., Client]
) -> None:
    """A selector on a topic subscription decides what the subscription holds: messages it can never deliver
    must not pile up in its queue (for ever, for a durable one)."""
    port = sb.ports["stomp"]
    c = clients(port, headers={"client-id": "sel"})
    c.subscribe("/topic/sel", "v", selector="color = 'red'")
    c.subscribe("/topic/sel", "d", selector="color = 'red'", **{"durable-subscription-name": "reds"})
    p = clients(port)
    for i in range(10):
        p.send("/topic/sel", f"blue-{i}", wait=False, color="blue", persistent="true")
    p.send("/topic/sel", "red", color="red", persistent="true")
    msgs = c.rec.wait_messages(2)
    assert sorted((m.headers["subscription"], m.body) for m in msgs) == [("d", b"red"), ("v", b"red")]
    assert len(c.rec.quiet(0.3)) == 2
    with tandem.connect(sb.url) as conn:
        held = {q["name"]: q["message_count"] for q in conn.manage("queue.stat") if q["address"] == "sel"}
    assert len(held) == 2 and "sel.reds" in held
    assert held == dict.fromkeys(held, 0), f"unmatched messages held by selector subscriptions: {held}"


# ==================================================== duplicate detection, expiry, plain destinations


@pytest.mark.parametrize("header", ["dedup-id", "_AMQ_DUPL_ID"])
def test_dedup_id_headers_drop_duplicate_sends(sb: BrokerProcess, clients: Callable[..., Client], header: str) -> None:
    c = clients(sb.ports["stomp"])
    q = f"dedup-{header.strip('_').lower()}"
    for body, did in (("a", "id-1"), ("a again", "id-1"), ("b", "id-2"), ("b again", "id-2"), ("a third", "id-1")):
        c.send(f"/queue/{q}", body, persistent="true", **{header: did})  # each one receipted
    got = native_drain(sb.url, q, 2)
    assert [m.body for m in got] == [b"a", b"b"]
    assert [m.dedup_id for m in got] == ["id-1", "id-2"]
    assert all(header not in m.properties for m in got)


def test_expires_header_expires_messages(sb: BrokerProcess, clients: Callable[..., Client]) -> None:
    c = clients(sb.ports["stomp"])
    now = int(time.time() * 1000)
    c.send("/queue/exp", "already gone", expires=str(now - 1000), persistent="true")
    c.send("/queue/exp", "gone soon", expires=str(now + 200), persistent="true")
    c.send("/queue/exp", "stays", expires=str(now + 600_000), persistent="true")
    c.send("/queue/exp", "no expiry", persistent="true")
    time.sleep(0.5)
    c.subscribe("/queue/exp", "s")
    msgs = c.rec.wait_messages(2)
    assert bodies(msgs) == [b"stays", b"no expiry"]
    assert msgs[0].headers["expires"] == str(now + 600_000) and msgs[1].headers["expires"] == "0"
    assert c.rec.quiet(0.3) == msgs


def test_plain_destinations_follow_the_address_settings(
    broker_factory: Factory, clients: Callable[..., Client]
) -> None:
    b = stomp_broker(broker_factory, address_settings={"news.#": {"default-address-routing-type": "multicast"}})
    c1 = clients(b.ports["stomp"])
    c2 = clients(b.ports["stomp"])
    # "news.sport" is multicast by its settings: both plain subscribers get every message
    c1.subscribe("news.sport", "n1")
    c2.subscribe("news.sport", "n2")
    c1.send("news.sport", "goal")
    assert bodies(c1.rec.wait_messages(1)) == [b"goal"] and bodies(c2.rec.wait_messages(1)) == [b"goal"]
    # any other plain name is anycast: one queue, each message to one of its consumers
    c1.subscribe("jobs", "j1")
    c2.subscribe("jobs", "j2")
    for i in range(6):
        c1.send("jobs", f"job-{i}")
    time.sleep(0.5)
    jobs = [m.body for m in c1.rec.messages + c2.rec.messages if m.headers["destination"] == "jobs"]
    assert sorted(jobs) == sorted(f"job-{i}".encode() for i in range(6))
    with tandem.connect(b.url) as conn:
        queues = {q["name"]: q for q in conn.manage("queue.stat")}
    assert queues["jobs"]["routing_type"] == "anycast"
    assert not any(name == "news.sport" for name in queues), "a multicast address has no queue of its own name"


def test_block_policy_stops_reading_a_stomp_producer_until_the_address_has_room(
    broker_factory: Factory, raws: Callable[[int], Raw]
) -> None:
    """STOMP has no producer credit: with BLOCK, a full address makes the broker stop handling
    that connection's frames (receipts stop) until consumers make room; nothing is refused or lost."""
    b = stomp_broker(broker_factory, address_settings={"blk": {"max-size-bytes": 4096, "address-full-policy": "BLOCK"}})
    r = raws(b.ports["stomp"])
    r.connect("1.2")
    body = b"x" * 1024
    frames = b"".join(
        b"SEND\ndestination:/queue/blk\nreceipt:r%d\ncontent-length:%d\n\n%s\0" % (i, len(body), body)
        for i in range(12)
    )
    r.send(frames)  # one write: all twelve arrive in one read
    held = r.quiet(0.8)
    receipts = [f.headers["receipt-id"] for f in held if f.command == "RECEIPT"]
    assert receipts == [f"r{i}" for i in range(len(receipts))] and 3 <= len(receipts) <= 5, receipts
    with tandem.connect(b.url) as conn:
        assert conn.manage("queue.stat", name="blk")[0]["message_count"] == len(receipts)
        consumer = conn.session().create_consumer("blk")
        got = 0
        while got < 12:  # draining makes room; the held SENDs go through as it does
            m = consumer.receive(5.0)
            assert m is not None, f"only {got} of 12 arrived"
            assert m.body == body
            got += 1
    rest = [f.headers["receipt-id"] for f in r.quiet(0.5) if f.command == "RECEIPT"]
    assert receipts + rest == [f"r{i}" for i in range(12)]


def test_fail_policy_answers_a_stomp_send_to_a_full_address_with_error(
    broker_factory: Factory, raws: Callable[[int], Raw]
) -> None:
    b = stomp_broker(broker_factory, address_settings={"fl": {"max-size-bytes": 2048, "address-full-policy": "FAIL"}})
    r = raws(b.ports["stomp"])
    r.connect("1.2")
    for i in range(10):
        r.send(b"SEND\ndestination:/queue/fl\nreceipt:r%d\n\n%s\0" % (i, b"y" * 1024))
    frames = r.until_closed(5.0)
    assert frames[-1].command == "ERROR" and "full" in frames[-1].headers["message"], frames
    stored = [f.headers["receipt-id"] for f in frames if f.command == "RECEIPT"]
    assert 1 <= len(stored) < 10
    with tandem.connect(b.url) as conn:
        assert conn.manage("queue.stat", name="fl")[0]["message_count"] == len(stored)


# ======================================================================= STOMP <-> native client


def test_stomp_producer_native_consumer(sb: BrokerProcess, clients: Callable[..., Client]) -> None:
    c = clients(sb.ports["stomp"])
    binary = bytes(range(256)) + b"\x00\x00end\x00"
    c.send(
        "/queue/to-native",
        binary,
        persistent="true",
        priority="7",
        color="red",
        n="5",
        **{"with-colon": "a:b\\c", "multi": "line1\nline2"},  # (stomp.py does not escape header names)
    )
    c.send("/queue/to-native", "plain text é", **{"content-type": "text/plain"})
    first, second = native_drain(sb.url, "to-native", 2)
    assert first.body == binary  # every byte, NULs included (sent with content-length)
    assert first.properties == {"color": "red", "n": "5", "with-colon": "a:b\\c", "multi": "line1\nline2"}
    assert first.durable is True
    assert first.priority == 7
    assert first.address == "to-native"
    assert second.body == "plain text é".encode()
    assert second.durable is False
    assert second.properties == {"content-type": "text/plain"}


@pytest.mark.parametrize("version", VERSIONS)
def test_native_producer_stomp_consumer(sb: BrokerProcess, clients: Callable[..., Client], version: str) -> None:
    c = clients(sb.ports["stomp"], version)
    q = f"from-native-{version}"
    c.subscribe(f"/queue/{q}", "n")
    binary = b"\x00\x01\x02" + bytes(range(255, -1, -1)) + b"\x00"
    props: dict[str, Any] = {"s": "text", "i": -42, "b": True, "f": 1.5}
    if version != "1.0":
        props["k:colon"] = "v:1\nv2"
    with tandem.connect(sb.url) as conn:
        prod = conn.session().create_producer(q)
        prod.send(tandem.Message(binary, properties=props, priority=8))
        prod.send(tandem.Message(b""))
    first, second = c.rec.wait_messages(2)
    assert first.body == binary
    assert first.headers["content-length"] == str(len(binary))
    assert first.headers["s"] == "text"
    assert first.headers["i"] == "-42"
    assert first.headers["b"] == "true"
    assert first.headers["f"] == "1.5"
    if version != "1.0":
        assert first.headers["k:colon"] == "v:1\nv2"
    assert first.headers["priority"] == "8"
    assert first.headers["persistent"] == "true"
    assert first.headers["destination"] == f"/queue/{q}"
    assert second.body == b""
    assert second.headers["content-length"] == "0"


def test_equal_property_values_of_different_types_render_by_their_own_type(
    sb: BrokerProcess, clients: Callable[..., Client]
) -> None:
    """MESSAGE property lines are remembered per (name, value, type): True == 1 == 1.0 in Python,
    yet each must render as itself, also when the same name comes again in later messages."""
    c = clients(sb.ports["stomp"])
    c.subscribe("/queue/typed", "t")
    values: list[Any] = [True, 1, 1.0, "1", False, 0, True]
    with tandem.connect(sb.url) as conn:
        prod = conn.session().create_producer("typed")
        for v in values:
            prod.send(tandem.Message(b"x", properties={"k": v}))
    got = [m.headers["k"] for m in c.rec.wait_messages(len(values))]
    assert got == ["true", "1", "1.0", "1", "false", "0", "true"]


def test_native_properties_named_like_frame_headers_do_not_reach_the_frame(
    sb: BrokerProcess, raws: Callable[[int], Raw]
) -> None:
    """A native property called content-length (or destination, ...) must not frame or mislabel the MESSAGE."""
    r = raws(sb.ports["stomp"])
    r.connect("1.2")
    r.send(b"SUBSCRIBE\nid:s\ndestination:/queue/clash\nreceipt:r\n\n\0")
    assert r.next_of("RECEIPT").headers["receipt-id"] == "r"
    body = b"0123456789\x00abc"
    props = {"content-length": "3", "destination": "/queue/elsewhere", "message-id": "fake", "ok": "yes"}
    with tandem.connect(sb.url) as conn:
        conn.session().create_producer("clash").send(tandem.Message(body, properties=props))
    m = r.next_of("MESSAGE")
    assert m.body == body
    assert m.headers["content-length"] == str(len(body))
    assert m.headers["destination"] == "/queue/clash"
    assert m.headers["message-id"] != "fake"
    assert m.headers["ok"] == "yes"
    head = bytes(r.raw).split(b"MESSAGE\n", 1)[1].split(b"\n\n", 1)[0]
    assert head.count(b"content-length:") == 1 and head.count(b"destination:") == 1, head


def test_raw_binary_body_with_nuls_round_trips(sb: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    r = raws(sb.ports["stomp"])
    r.connect("1.2")
    body = b"\x00" * 3 + b"mid\x00dle" + b"\x00"
    r.send(b"SUBSCRIBE\nid:s\ndestination:/queue/nuls\n\n\0")
    r.send(b"SEND\ndestination:/queue/nuls\ncontent-length:%d\n\n" % len(body) + body + b"\0")
    m = r.next_of("MESSAGE")
    assert m.body == body
    assert m.headers["content-length"] == str(len(body))


# ================================================================================== prefetch


def test_prefetch_count_bounds_unacknowledged_deliveries(sb: BrokerProcess, clients: Callable[..., Client]) -> None:
    port = sb.ports["stomp"]
    c = clients(port)
    for i in range(10):
        c.send("/queue/prefetch", f"p{i}", wait=i == 9)
    c.subscribe("/queue/prefetch", "s", ack="client-individual", **{"prefetch-count": "3"})
    msgs = c.rec.wait_messages(3)
    assert len(c.rec.quiet(0.4)) == 3
    c.ack(msgs[0])
    assert len(c.rec.wait_messages(4)) == 4
    assert len(c.rec.quiet(0.3)) == 4
    c.conn.nack(msgs[1].headers["ack"])  # a NACK frees a slot too (the message comes back)
    assert len(c.rec.wait_messages(5)) == 5
    assert len(c.rec.quiet(0.3)) == 5
    # cumulative acks free as many slots as they acknowledge
    d = clients(port)
    d.subscribe("/queue/prefetch", "t", ack="client", **{"prefetch-count": "2"})
    got = d.rec.wait_messages(2)
    assert len(d.rec.quiet(0.3)) == 2
    d.ack(got[1])
    assert len(d.rec.wait_messages(4)) == 4
    assert len(d.rec.quiet(0.3)) == 4


def test_prefetch_count_holds_after_an_aborted_transactional_ack(
    sb: BrokerProcess, clients: Callable[..., Client]
) -> None:
    """prefetch-count 2: after ABORT brings back a transactionally acked message, at most 2 are unacknowledged."""
    c = clients(sb.ports["stomp"])
    for i in range(4):
        c.send("/queue/prefetch-tx", f"q{i}")
    c.subscribe("/queue/prefetch-tx", "s", ack="client-individual", **{"prefetch-count": "2"})
    m0, m1 = c.rec.take(2)
    assert c.rec.quiet(0.3) == []
    c.frame("BEGIN", transaction="t")
    c.ack(m0, transaction="t")
    (m2,) = c.rec.take(1)  # the acked slot is reused
    assert m2.body == b"q2"
    c.frame("ABORT", transaction="t")  # m0 is unacknowledged again: m1, m2 and m0 would make 3
    extra = c.rec.quiet(0.5)
    assert bodies(extra) == [], f"{2 + len(extra)} unacknowledged deliveries with prefetch-count 2"
    c.ack(m1)
    (back,) = c.rec.take(1)
    assert back.body == b"q0" and back.headers["redelivered"] == "true"


# ================================================================================== security


SECURE = (  # what app may do (decision 0060); the users file holds app itself
    '[security-settings."#"]\nsend = ["app"]\nconsume = ["app"]\ncreate-address = ["app"]\n'
    'create-durable-queue = ["app"]\n'
)


def test_login_is_checked_when_security_is_enabled(
    broker_factory: Factory, clients: Callable[..., Client], raws: Callable[[int], Raw]
) -> None:
    # (a cluster password of its own: a secured broker refuses to start with the built-in one)
    b = stomp_broker(
        broker_factory,
        extra_toml=SECURE,
        security_enabled=True,
        cluster_password="pair-secret",
        users={"app": ("secret", ["app"])},
    )
    port = b.ports["stomp"]
    for headers in ({"login": "app", "passcode": "wrong"}, {"login": "nobody", "passcode": "secret"}, {}):
        r = raws(port)
        lines = "".join(f"{k}:{v}\n" for k, v in headers.items())
        r.send(f"CONNECT\naccept-version:1.2\nhost:x\n{lines}\n\0".encode())
        err = assert_error_then_closed(r, "authentication")
        assert "secret" not in err.headers["message"] and "wrong" not in err.headers["message"]
    with pytest.raises(stomp.exception.ConnectFailedException):
        Client(port, login="app", passcode="nope").close()
    ok = clients(port, login="app", passcode="secret")
    ok.subscribe("/queue/secured", "s")
    ok.send("/queue/secured", "in")
    assert bodies(ok.rec.wait_messages(1)) == [b"in"]
    old = clients(port, "1.0", login="app", passcode="secret")
    old.send("/queue/secured", "also")
    assert bodies(ok.rec.wait_messages(2))[1] == b"also"


# ========================================================= raw edge cases on one shared broker


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base: Path = tmp_path_factory.mktemp("stomp-shared")
    b = BrokerProcess(base / "shared", name="shared", extra_toml=STOMP_ACCEPTORS, max_frame_size=SHARED_MAX_FRAME)
    b.start()
    yield b
    b.kill()


@pytest.fixture(scope="module")
def bystander(shared: BrokerProcess) -> Iterator[Client]:
    """One stomp.py client connected to the shared broker for all edge-case tests: it must keep working."""
    c = Client(shared.ports["stomp"], "1.2")
    c.subscribe("/queue/bystander", "b", ack="client-individual")
    yield c
    c.close()


def check_bystander(c: Client, tag: str) -> None:
    assert c.conn.is_connected(), "the bystander's connection went down"
    tag = f"{tag} #{c.rid()}"  # unique
    c.send("/queue/bystander", tag)
    assert c.rec.wait_for(lambda: any(m.body == tag.encode() for m in c.rec.messages))
    (m,) = [m for m in c.rec.messages if m.body == tag.encode()]
    c.ack(m)
    assert not c.rec.errors and not c.rec.disconnected


DEST = b"destination:/queue/edge\n"
DURABLE_SUB = b"SUBSCRIBE\nid:1\ndestination:/topic/t\ndurable-subscription-name:d\n\n\0"
BAD_INPUT: list[tuple[str, str | None, bytes, str | None]] = [
    # (id, version to CONNECT with first or None, bytes, words the ERROR message must contain)
    ("unknown-command", "1.2", b"FROB\nk:v\n\n\0", "unknown command"),
    ("lowercase-command", "1.1", b"send\n" + DEST + b"\nx\0", "unknown command"),
    ("server-command-from-client", "1.2", b"MESSAGE\n" + DEST + b"\nx\0", "unknown command"),
    ("garbage", None, b"\x00\x01\x02\xff\xfe garbage \x80\n\n\0", None),
    ("garbage-after-connect", "1.2", b"\x17\x03\x03\x00\x10\xde\xad\xbe\xef\n\n", None),
    ("http-request", None, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", "unknown command"),
    ("send-before-connect", None, b"SEND\n" + DEST + b"\nhi\0", "before CONNECT"),
    ("subscribe-before-connect", None, b"SUBSCRIBE\nid:1\n" + DEST + b"\n\0", "before CONNECT"),
    ("disconnect-before-connect", None, b"DISCONNECT\nreceipt:x\n\n\0", "before CONNECT"),
    ("send-without-destination", "1.2", b"SEND\nk:v\n\nhi\0", "destination"),
    ("send-empty-destination", "1.1", b"SEND\ndestination:/queue/\n\nhi\0", "destination"),
    ("subscribe-without-destination", "1.2", b"SUBSCRIBE\nid:1\n\n\0", "destination"),
    ("subscribe-without-id", "1.2", b"SUBSCRIBE\n" + DEST + b"\n\0", "id"),
    ("send-unknown-transaction", "1.2", b"SEND\n" + DEST + b"transaction:nope\n\nhi\0", "unknown transaction"),
    ("commit-unknown-transaction", "1.2", b"COMMIT\ntransaction:nope\n\n\0", "unknown transaction"),
    ("abort-unknown-transaction", "1.1", b"ABORT\ntransaction:nope\n\n\0", "unknown transaction"),
    ("commit-without-transaction", "1.2", b"COMMIT\n\n\0", "transaction"),
    ("begin-twice", "1.2", b"BEGIN\ntransaction:t\n\n\0BEGIN\ntransaction:t\n\n\0", "already open"),
    ("ack-unknown-id-1.2", "1.2", b"ACK\nid:1.987654\n\n\0", "unknown ack id"),
    ("nack-unknown-id-1.2", "1.2", b"NACK\nid:42.42\n\n\0", "unknown ack id"),
    ("ack-malformed-id-1.2", "1.2", b"ACK\nid:nonsense\n\n\0", "ack"),
    ("ack-unknown-subscription-1.1", "1.1", b"ACK\nmessage-id:12345\nsubscription:nope\n\n\0", "subscription"),
    ("ack-unknown-message-1.0", "1.0", b"ACK\nmessage-id:12345\n\n\0", "not awaiting an ack"),
    ("nack-in-1.0", "1.0", b"NACK\nmessage-id:1\n\n\0", "1.1"),
    ("unsubscribe-unknown", "1.2", b"UNSUBSCRIBE\nid:nope\n\n\0", "no subscription"),
    ("duplicate-subscription-id", "1.2", b"SUBSCRIBE\nid:1\n" + DEST + b"\n\0SUBSCRIBE\nid:1\n" + DEST + b"\n\0", "id"),
    ("bad-ack-mode", "1.2", b"SUBSCRIBE\nid:1\n" + DEST + b"ack:sometimes\n\n\0", "ack"),
    ("bad-prefetch", "1.2", b"SUBSCRIBE\nid:1\n" + DEST + b"prefetch-count:many\n\n\0", "prefetch"),
    ("invalid-selector", "1.2", b"SUBSCRIBE\nid:1\n" + DEST + b"selector:color = = 'x\n\n\0", None),
    ("durable-without-client-id", "1.2", DURABLE_SUB, "client-id"),
    ("bad-priority", "1.2", b"SEND\n" + DEST + b"priority:12\n\nx\0", "priority"),
    ("non-numeric-expires", "1.2", b"SEND\n" + DEST + b"expires:soon\n\nx\0", "expires"),
    ("header-without-colon", "1.2", b"SEND\n" + DEST + b"no colon here\n\nx\0", "':'"),
    ("non-utf8-header", "1.2", b"SEND\n" + DEST + b"k:\xff\n\nx\0", "UTF-8"),
    ("undefined-escape-1.2", "1.2", b"SEND\n" + DEST + b"k:a\\tb\n\nx\0", "escape"),
    ("cr-escape-in-1.1", "1.1", b"SEND\n" + DEST + b"k:a\\rb\n\nx\0", "escape"),
    ("bad-content-length", "1.2", b"SEND\n" + DEST + b"content-length:ten\n\nx\0", "content-length"),
    ("negative-content-length", "1.2", b"SEND\n" + DEST + b"content-length:-3\n\nx\0", "ASCII digits"),
    ("missing-nul-after-content-length", "1.2", b"SEND\n" + DEST + b"content-length:3\n\nabcdef\0", "NUL"),
    ("oversize-declared-content-length", "1.2", b"SEND\n" + DEST + b"content-length:100000\n\n", "max-frame-size"),
    ("oversize-body", "1.2", b"SEND\n" + DEST + b"\n" + b"x" * (SHARED_MAX_FRAME + 500), "max-frame-size"),
    ("oversize-headers", "1.2", b"SEND\n" + DEST + b"k:" + b"v" * (SHARED_MAX_FRAME + 500), "max-frame-size"),
    ("oversize-complete-frame", "1.0", b"SEND\n" + DEST + b"\n" + b"y" * SHARED_MAX_FRAME + b"\0", "max-frame-size"),
    ("no-common-version", None, b"CONNECT\naccept-version:2.0,3.1\nhost:x\n\n\0", "version"),
    ("bad-heart-beat", None, b"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:often\n\n\0", "heart-beat"),
    ("connect-twice", "1.2", b"CONNECT\naccept-version:1.2\nhost:x\n\n\0", "already connected"),
]


@pytest.mark.parametrize(("version", "data", "words"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT])
def test_bad_input_gets_error_then_close(
    shared: BrokerProcess,
    bystander: Client,
    raws: Callable[[int], Raw],
    version: str | None,
    data: bytes,
    words: str | None,
) -> None:
    r = raws(shared.ports["stomp"])
    if version is not None:
        r.connect(version)
    r.send(data)
    t0 = time.monotonic()
    assert_error_then_closed(r, words)
    assert r.eof_at is not None and r.eof_at - t0 < 3.0
    check_bystander(bystander, f"after {data[:30]!r}")


def test_error_carries_the_receipt_id_of_the_bad_frame(
    shared: BrokerProcess, bystander: Client, raws: Callable[[int], Raw]
) -> None:
    r = raws(shared.ports["stomp"])
    r.connect("1.2")
    r.send(b"SEND\nreceipt:oops-1\n\nno destination\0")
    err = assert_error_then_closed(r, "destination")
    assert err.headers["receipt-id"] == "oops-1"
    assert err.headers["content-type"] == "text/plain"
    assert err.body and b"destination" in err.body
    check_bystander(bystander, "after receipt-id")


def test_nack_with_an_unknown_transaction_gets_an_error(
    shared: BrokerProcess, bystander: Client, raws: Callable[[int], Raw]
) -> None:
    """Like SEND, ACK, COMMIT and ABORT: a NACK naming a transaction that is not open is an ERROR."""
    r = raws(shared.ports["stomp"])
    r.connect("1.2")
    r.send(b"SUBSCRIBE\nid:s\ndestination:/queue/nack-tx\nack:client-individual\n\n\0")
    r.send(b"SEND\ndestination:/queue/nack-tx\n\nx\0")
    m = r.next_of("MESSAGE")
    r.send(f"NACK\nid:{m.headers['ack']}\ntransaction:nope\nreceipt:n\n\n\0".encode())
    assert_error_then_closed(r, "unknown transaction")
    check_bystander(bystander, "after NACK in an unknown transaction")


def test_frames_after_the_bad_one_are_not_processed(
    shared: BrokerProcess, bystander: Client, raws: Callable[[int], Raw]
) -> None:
    r = raws(shared.ports["stomp"])
    r.connect("1.2")
    r.send(b"FROB\n\n\0SEND\ndestination:/queue/never-sent\n\nx\0")
    assert_error_then_closed(r, "unknown command")
    with tandem.connect(shared.url) as conn:
        names = {q["name"] for q in conn.manage("queue.stat")}
    assert "never-sent" not in names and "bystander" in names
    check_bystander(bystander, "after FROB")


TLS_CLIENT_HELLO = b"\x16\x03\x01\x00\xf1\x01\x00\x00\xed\x03\x03" + bytes(range(128, 256)) + bytes(range(14, 128))


@pytest.mark.parametrize(
    ("connect", "data"),
    [(False, TLS_CLIENT_HELLO), (True, b"HELLO WORLD\r\n")],
    ids=["tls-client-hello-no-eol", "unknown-command-line-no-blank-line"],
)
def test_garbage_that_never_completes_a_header_block_gets_an_error(
    shared: BrokerProcess, bystander: Client, raws: Callable[[int], Raw], connect: bool, data: bytes
) -> None:
    """Bytes that can never start a valid frame (binary junk such as a TLS ClientHello, or a complete command
    line naming no command) get ERROR and close at once — not a silent wait for a blank line until the
    connection TTL (60 s by default)."""
    r = raws(shared.ports["stomp"])
    if connect:
        r.connect("1.2")
    r.send(data)
    assert_error_then_closed(r, timeout=4.0)
    check_bystander(bystander, "after junk without a blank line")


def test_good_frames_before_bad_input_in_one_read_are_acted_on(sb: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    """A SEND followed by garbage in the same packet: the SEND is stored and receipted, then ERROR."""
    r = raws(sb.ports["stomp"])
    r.connect("1.2")
    r.send(b"SEND\ndestination:/queue/before-junk\npersistent:true\nreceipt:r1\n\nkept\0FROB\n\n\0")
    frames = r.until_closed(5.0)
    assert [f.command for f in frames] == ["RECEIPT", "ERROR"], frames
    assert frames[0].headers["receipt-id"] == "r1"
    assert "FROB" in frames[1].headers["message"]
    assert [m.body for m in native_drain(sb.url, "before-junk", 1)] == [b"kept"]


# ---------------------------------------------------------------------- header escaping (raw)


def _sub(r: Raw, dest: str, sid: str = "s") -> None:
    r.send(f"SUBSCRIBE\nid:{sid}\ndestination:{dest}\nreceipt:sub-{sid}\n\n\0".encode())
    r.next_of("RECEIPT", **{"receipt-id": f"sub-{sid}"})


def test_header_escaping_1_0_none(shared: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    port = shared.ports["stomp"]
    old, new = raws(port), raws(port)
    old.connect("1.0")
    new.connect("1.2")
    _sub(old, "/queue/esc10", "o")
    old.send(b"SEND\ndestination:/queue/esc10\nk:a\\cb\\n\nurl:http://x:1/\n\nbody\0")
    m = old.next_of("MESSAGE")
    assert b"\nk:a\\cb\\n\n" in old.raw  # 1.0: backslashes are plain text both ways
    assert m.headers["k"] == "a\\cb\\n" and m.headers["url"] == "http://x:1/"
    # the same property seen by a 1.2 client is escaped for 1.2
    _sub(new, "/queue/esc10b", "n")
    old.send(b"SEND\ndestination:/queue/esc10b\nk:a\\cb\n\nbody\0")
    m = new.next_of("MESSAGE")
    assert b"\nk:a\\\\cb\n" in new.raw
    assert m.headers["k"] == "a\\cb"


def test_1_0_subscriber_gets_well_formed_frames_whatever_the_properties(
    shared: BrokerProcess, raws: Callable[[int], Raw]
) -> None:
    """1.0 has no escapes: a property holding an EOL must not break the MESSAGE frame into a bad header line."""
    port = shared.ports["stomp"]
    old, new = raws(port), raws(port)
    old.connect("1.0")
    new.connect("1.2")
    _sub(old, "/queue/esc10-eol", "o")
    new.send(b"SEND\ndestination:/queue/esc10-eol\nplain:ok\nk:a\\nb\n\nbody\0")
    data = b""  # read the bytes directly: the codec would (rightly) reject a broken frame
    deadline = time.monotonic() + 5
    while b"MESSAGE\n" not in data or b"\0" not in data[data.index(b"MESSAGE\n") :]:
        old.sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = old.sock.recv(65536)
        assert chunk and time.monotonic() < deadline, f"no MESSAGE: {data!r}"
        data += chunk
    frame = data[data.index(b"MESSAGE\n") :]
    head = frame.split(b"\n\n", 1)[0]
    bad = [line for line in head.split(b"\n")[1:] if b":" not in line]
    assert not bad, f"header lines without ':' in a 1.0 MESSAGE: {bad} in {head!r}"
    (m,) = StompParser(1 << 20, "1.0", SERVER_COMMANDS).feed(frame)
    assert m.body == b"body" and m.headers["plain"] == "ok" and m.headers["destination"] == "/queue/esc10-eol"


def test_header_escaping_1_1(shared: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    r = raws(shared.ports["stomp"])
    r.connect("1.1")
    _sub(r, "/queue/esc11")
    r.send(b"SEND\ndestination:/queue/esc11\nk\\cey:a\\cb\\nc\\\\d\n\nbody\0")
    m = r.next_of("MESSAGE")
    assert m.headers["k:ey"] == "a:b\nc\\d"
    assert b"\nk\\cey:a\\cb\\nc\\\\d\n" in r.raw
    with tandem.connect(shared.url) as conn:
        prod = conn.session().create_producer("esc11")
        prod.send(tandem.Message(b"n", properties={"p": "x\ry"}))
    m = r.next_of("MESSAGE")
    assert b"\np:x\ry\n" in r.raw  # 1.1 has no \r escape: the CR goes out as it is
    assert m.headers["p"] == "x\ry"


def test_header_escaping_1_2_includes_cr(shared: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    r = raws(shared.ports["stomp"])
    r.connect("1.2")
    _sub(r, "/queue/esc12")
    r.send(b"SEND\ndestination:/queue/esc12\nk:a\\rb\\nc\\cd\\\\\n\nbody\0")
    m = r.next_of("MESSAGE")
    assert m.headers["k"] == "a\rb\nc:d\\"
    assert b"\nk:a\\rb\\nc\\cd\\\\\n" in r.raw
    r.send(b"SEND\ndestination:/queue/esc12-native\nk:a\\rb\\c\n\nbody\0")
    r.send(b"SEND\ndestination:/queue/esc12\nreceipt:flush\n\nz\0")
    r.next_of("RECEIPT", **{"receipt-id": "flush"})
    (native,) = native_drain(shared.url, "esc12-native", 1)
    assert native.properties == {"k": "a\rb:"}


def test_connect_headers_are_never_unescaped(shared: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    r = raws(shared.ports["stomp"])
    # \\q would be an undefined escape anywhere else; \\c would be a ':'
    r.send(b"CONNECT\naccept-version:1.2\nhost:x\nclient-id:odd\\cname\\q\nlogin:a\\b\n\n\0")
    frame = r.next()
    assert frame is not None and frame.command == "CONNECTED", frame
    assert frame.headers["version"] == "1.2"
    r.parser.version = "1.2"
    r.send(b"SUBSCRIBE\nid:s\ndestination:/topic/raw-cid\ndurable-subscription-name:d\nreceipt:s\n\n\0")
    r.next_of("RECEIPT", **{"receipt-id": "s"})
    with tandem.connect(shared.url) as conn:
        names = {q["name"] for q in conn.manage("queue.stat")}
    assert "odd\\cname\\q.d" in names  # the client-id exactly as sent


def test_escapes_in_frames_pipelined_with_connect(shared: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    """CONNECT and the next frames in one packet: frames after a 1.2 CONNECT are unescaped as 1.2."""
    port = shared.ports["stomp"]
    r = raws(port)
    r.send(
        b"CONNECT\naccept-version:1.2\nhost:x\n\n\0"
        b"SUBSCRIBE\nid:s\ndestination:/queue/pipelined-esc\n\n\0"
        b"SEND\ndestination:/queue/pipelined-esc\nk:a\\cb\n\nx\0"
    )
    r.parser.version = "1.2"
    assert r.next_of("CONNECTED").headers["version"] == "1.2"
    m = r.next_of("MESSAGE")
    assert m.headers["k"] == "a:b"


def test_crlf_line_endings(shared: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    r = raws(shared.ports["stomp"])
    r.send(b"CONNECT\r\naccept-version:1.2\r\nhost:x\r\n\r\n\0\r\n")
    assert r.next_of("CONNECTED").headers["version"] == "1.2"
    r.parser.version = "1.2"
    r.send(b"SUBSCRIBE\r\nid:s\r\ndestination:/queue/crlf\r\nreceipt:s\r\n\r\n\0\r\n")
    r.next_of("RECEIPT", **{"receipt-id": "s"})
    r.send(b"SEND\r\ndestination:/queue/crlf\r\nk:v\r\n\r\nline1\r\nline2\0\r\n\r\n")
    m = r.next_of("MESSAGE")
    assert m.headers["k"] == "v"
    assert m.headers["destination"] == "/queue/crlf"
    assert m.body == b"line1\r\nline2"


def test_heart_beat_eols_between_frames_are_accepted(shared: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    r = raws(shared.ports["stomp"])
    r.connect("1.1")
    r.send(b"\n\n\r\n")
    _sub(r, "/queue/eols")
    r.send(b"\nSEND\ndestination:/queue/eols\n\nx\0\n\n\nSEND\ndestination:/queue/eols\n\ny\0\n")
    assert [r.next_of("MESSAGE").body for _ in range(2)] == [b"x", b"y"]
    assert not [f for f in r.skipped if f.command == "ERROR"]


def test_stomp_command_and_1_0_connect(shared: BrokerProcess, raws: Callable[[int], Raw]) -> None:
    r = raws(shared.ports["stomp"])
    r.send(b"STOMP\naccept-version:1.0,1.1\nhost:x\n\n\0")
    assert r.next_of("CONNECTED").headers["version"] == "1.1"
    old = raws(shared.ports["stomp"])
    old.send(b"CONNECT\nlogin:\npasscode:\n\n\0")  # no accept-version: 1.0
    connected = old.next_of("CONNECTED")
    assert connected.headers["version"] == "1.0"
    assert "heart-beat" not in connected.headers
    # 1.0 SUBSCRIBE without id: the destination is the subscription
    old.send(b"SUBSCRIBE\ndestination:/queue/v10\nack:client\n\n\0SEND\ndestination:/queue/v10\n\nhi\0")
    m = old.next_of("MESSAGE")
    assert m.headers["subscription"] == "/queue/v10"
    assert "ack" not in m.headers
    old.send(f"ACK\nmessage-id:{m.headers['message-id']}\nreceipt:a\n\n\0".encode())
    old.next_of("RECEIPT", **{"receipt-id": "a"})
    old.send(b"UNSUBSCRIBE\ndestination:/queue/v10\nreceipt:u\n\n\0")
    old.next_of("RECEIPT", **{"receipt-id": "u"})
