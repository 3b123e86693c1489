"""Bad input on the native port, over raw sockets, while a well-behaved client keeps working.

Connection-level errors (bad magic, oversize frames, unknown or malformed
packets, anything before HELLO, a wrong protocol version) must get one ERROR
frame and then a close of that connection only. Command-level errors (a missing
queue, a bad management call) must get an EXCEPTION and leave the connection
usable. Throughout, another client sends, receives and acknowledges durable
messages on the same broker; at the end it must have seen no error and received
exactly what it sent, and after a kill -9 and restart nothing it kept is lost.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest

import tandem
from broker_process import BrokerProcess
from tandem.core.message import MessageData
from tandem.errors import ErrorCode
from tandem.protocol import native as p

MAX_FRAME = 65536
SETTINGS: dict[str, Any] = {
    "max_frame_size": MAX_FRAME,
    "address_settings": {"#": {"auto_create_queues": False, "auto_create_addresses": False}},
}
IO_TIMEOUT = 5.0  # a reply the broker owes us
CLOSE_TIMEOUT = 3.0  # "closes the connection within a few seconds"
GOOD_Q = "good"
KEEP_Q = "good.keep"

Factory = Callable[..., BrokerProcess]


def frame(payload: bytes) -> bytes:
    return p.LENGTH.pack(len(payload)) + payload


def packb(obj: Any) -> bytes:
    return msgspec.msgpack.encode(obj)


# --------------------------------------------------------------- raw socket
class Raw:
    """A raw TCP connection to the native port; every read is bounded by a deadline."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT)
        self.sock.settimeout(IO_TIMEOUT)
        self.reader = p.FrameReader(p.ServerPacket, 1 << 24, expect_magic=False)
        self.pending: list[Any] = []
        self.eof = False

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float, what: str) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"timed out waiting for {what}; got so far: {self.pending!r}")
        self.sock.settimeout(left)
        problem = ""
        data = b""
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            problem = "timed out"
        except ConnectionResetError:
            problem = "connection reset (RST)"
        if problem:
            pytest.fail(f"{problem} waiting for {what}; got so far: {self.pending!r}")
        if not data:
            self.eof = True
            return
        self.pending.extend(self.reader.feed(data))

    def next(self, timeout: float = IO_TIMEOUT) -> Any:
        """The next packet from the broker (its keep-alive PINGs skipped)."""
        deadline = time.monotonic() + timeout
        for _ in range(10_000):
            while self.pending:
                pkt = self.pending.pop(0)
                if not isinstance(pkt, p.Ping):
                    return pkt
            if self.eof:
                pytest.fail("the broker closed the connection")
            self._fill(deadline, "a packet")
        pytest.fail("no packet")

    def hello(self, version: int = p.PROTOCOL_VERSION) -> p.HelloOk:
        self.send(p.MAGIC + p.encode(p.Hello(version, client_name="bad-input-test")))
        ok = self.next()
        assert isinstance(ok, p.HelloOk), ok
        return ok

    def expect_error_and_close(self, timeout: float = CLOSE_TIMEOUT) -> p.Error:
        """Read until EOF: the broker must send exactly one ERROR, nothing else, then close."""
        deadline = time.monotonic() + timeout
        for _ in range(10_000):
            if self.eof:
                break
            self._fill(deadline, "an ERROR frame and the close of the connection")
        assert self.eof
        errors = [x for x in self.pending if isinstance(x, p.Error)]
        others = [x for x in self.pending if not isinstance(x, (p.Error, p.Ping))]
        assert len(errors) == 1 and not others, f"expected one ERROR then EOF, got {self.pending!r}"
        return errors[0]

    def expect_open(self) -> None:
        """PING → PONG: the connection is still up and in sync."""
        self.send(p.encode(p.Ping()))
        pkt = self.next()
        assert isinstance(pkt, p.Pong), pkt


# -------------------------------------------------------------- good client
class GoodClient:
    """A well-behaved blocking client on its own thread: send, receive, ack; all durable and confirmed.

    Every fifth round it also sends a message to KEEP_Q that nobody consumes: those
    must all be there after a kill -9 and restart.
    """

    def __init__(self, url: str, max_rounds: int = 20_000, max_seconds: float = 60.0) -> None:
        self.url = url
        self.max_rounds = max_rounds
        self.max_seconds = max_seconds
        self.sent: list[bytes] = []
        self.received: list[bytes] = []
        self.kept: list[bytes] = []
        self.errors: list[BaseException] = []
        self.rounds = 0
        self.done = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="good-client", daemon=True)

    def _run(self) -> None:
        try:
            with tandem.connect(self.url, call_timeout=10_000) as conn:
                conn.manage("queue.create", name=GOOD_Q, exists_ok=True)
                conn.manage("queue.create", name=KEEP_Q, exists_ok=True)
                session = conn.session(ack_mode="client")
                prod = session.create_producer(GOOD_Q)
                keep = session.create_producer(KEEP_Q)
                cons = session.create_consumer(GOOD_Q)
                deadline = time.monotonic() + self.max_seconds
                for i in range(self.max_rounds):
                    if self._stop.is_set() or time.monotonic() > deadline:
                        break
                    body = f"good-{i}".encode()
                    prod.send(body)  # returns once the broker confirmed it (after fsync)
                    self.sent.append(body)
                    msg = cons.receive(timeout=10)
                    if msg is None:
                        raise AssertionError(f"good client: message {i} not received within 10 s")
                    msg.ack()  # returns once the ack is durable
                    self.received.append(msg.body)
                    if i % 5 == 0:
                        kept = f"keep-{i}".encode()
                        keep.send(kept)
                        self.kept.append(kept)
                    self.rounds += 1
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self.done = True

    def wait_rounds(self, target: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.rounds < target and not self.done and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not self.errors, f"good client failed: {self.errors[0]!r}"
        assert self.rounds >= target, f"good client stuck at {self.rounds} rounds (wanted {target})"

    def __enter__(self) -> GoodClient:
        self._thread.start()
        self.wait_rounds(3)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.wait_rounds(self.rounds + 5)  # it still works after the bad input
        finally:
            self._stop.set()
            self._thread.join(30)
        assert not self._thread.is_alive(), "good client did not stop"

    def check(self) -> None:
        assert not self.errors, f"good client saw an error: {self.errors[0]!r}"
        assert self.rounds >= 8
        assert self.received == self.sent
        assert len(self.kept) == (self.rounds + 4) // 5


def _close_pipe(b: BrokerProcess) -> None:
    """BrokerProcess leaves the child's stdout pipe open; close it once the child is gone (no ResourceWarning)."""
    if b.proc is not None and b.proc.poll() is not None and b.proc.stdout is not None:
        b.proc.stdout.close()


def restart(b: BrokerProcess) -> None:
    """kill -9, then start again on the same data directory."""
    b.kill()
    _close_pipe(b)
    b.start()


@pytest.fixture
def brokers(broker_factory: Factory) -> Iterator[Factory]:
    """broker_factory (settings of this module as defaults) that also closes the pipes it leaves open."""
    made: list[BrokerProcess] = []

    def make(**settings: Any) -> BrokerProcess:
        b = broker_factory(**{**SETTINGS, **settings})
        made.append(b)
        return b

    yield make
    for b in made:
        b.kill()
        _close_pipe(b)


def assert_unharmed(b: BrokerProcess, good: GoodClient) -> None:
    """The broker survived, the good client was never disturbed, and a kill -9 loses nothing it kept."""
    good.check()
    assert b.running, f"broker died:\n{b.log_text()[-3000:]}"
    restart(b)
    with tandem.connect(b.url) as conn:
        stats = {r["name"]: r for r in conn.manage("queue.stat")}
        assert stats[GOOD_Q]["message_count"] == 0
        assert stats[KEEP_Q]["message_count"] == len(good.kept)
        cons = conn.session().create_consumer(KEEP_Q)
        got = []
        for _ in range(len(good.kept)):
            msg = cons.receive(timeout=IO_TIMEOUT)
            assert msg is not None, f"only {len(got)} of {len(good.kept)} kept messages after restart"
            got.append(msg.body)
        assert got == good.kept
        assert cons.receive(timeout=0.2) is None


def assert_connections(url: str, expected: int, timeout: float = 3.0) -> None:
    """The broker counts `expected` connections besides the one asking (closes are async: poll a little)."""
    deadline = time.monotonic() + timeout
    with tandem.connect(url) as conn:
        for _ in range(1000):
            n = int(conn.manage("broker.status")["connections"]) - 1
            if n == expected or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert n == expected, f"broker counts {n} other connections, expected {expected}"


@contextmanager
def guarded(make: Factory, **settings: Any) -> Iterator[tuple[BrokerProcess, GoodClient]]:
    b = make(**settings).start()
    with GoodClient(b.url) as good:
        yield b, good
    assert_unharmed(b, good)


# ------------------------------------------------------- connection errors
@pytest.mark.parametrize(
    "garbage",
    [b"GARBAGE!", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"TNDX" + p.encode(p.Hello(1)), b"\x16\x03\x01\x02\x00"],
    ids=["ascii", "http", "almost-magic", "tls-hello"],
)
def test_garbage_instead_of_magic(brokers: Factory, garbage: bytes) -> None:
    with guarded(brokers) as (b, _good), Raw(b.port) as raw:
        raw.send(garbage)
        err = raw.expect_error_and_close()
        assert err.code == ErrorCode.PROTOCOL
        assert "magic" in err.message


def test_oversize_length_prefix(brokers: Factory) -> None:
    with guarded(brokers) as (b, _good):
        with Raw(b.port) as raw:
            raw.hello()
            raw.send(p.LENGTH.pack(MAX_FRAME + 1))  # the prefix alone is enough to refuse
            err = raw.expect_error_and_close()
        assert err.code == ErrorCode.FRAME_TOO_LARGE
        assert str(MAX_FRAME) in err.message
        with Raw(b.port) as raw:  # a huge prefix before HELLO is refused the same way
            raw.send(p.MAGIC + p.LENGTH.pack(0xFFFFFFFF))
            assert raw.expect_error_and_close().code == ErrorCode.FRAME_TOO_LARGE


def _send_frame_of_exactly(size: int, channel: int, cmd: int, address: str) -> bytes:
    """A SEND frame whose payload is exactly `size` bytes."""
    body_len = size
    for _ in range(10):
        data = MessageData(address, True, body=b"b" * body_len)
        payload = packb(p.SendData(channel, cmd, data))
        if len(payload) == size:
            return frame(payload)
        body_len -= len(payload) - size
    raise AssertionError("could not size the frame")


def test_frame_of_exactly_max_frame_size_is_accepted(brokers: Factory) -> None:
    with guarded(brokers) as (b, _good):
        with Raw(b.port) as raw:
            raw.hello()
            raw.send(p.encode(p.Manage(0, 1, "queue.create", {"name": "big"})))
            assert isinstance(raw.next(), p.Response)
            raw.send(p.encode(p.CreateSession(1, 1)))
            assert raw.next() == p.Response(1, 1, None)
            exact = _send_frame_of_exactly(MAX_FRAME, 1, 2, "big")
            assert len(exact) == 4 + MAX_FRAME
            raw.send(exact)
            assert raw.next() == p.Confirm(1, 2)  # durable and confirmed
            over = _send_frame_of_exactly(MAX_FRAME + 1, 1, 3, "big")
            raw.send(over[:4])
            assert raw.expect_error_and_close().code == ErrorCode.FRAME_TOO_LARGE
        with tandem.connect(b.url) as conn:
            [stat] = conn.manage("queue.stat", name="big")
            assert stat["message_count"] == 1


def test_unknown_packet_tags(brokers: Factory) -> None:
    tags = [99, 0, -1, 2**40, 30, 33]  # 30 and 33 are server-only packets (CONFIRM, DELIVER)
    with guarded(brokers) as (b, _good):
        for tag in tags:
            with Raw(b.port) as raw:
                raw.hello()
                raw.send(frame(packb([tag, 1, 1])))
                err = raw.expect_error_and_close()
                assert err.code == ErrorCode.UNKNOWN_PACKET, (tag, err)
                assert str(tag) in err.message


@pytest.mark.parametrize(
    "packet",
    [p.CreateSession(1, 1), p.Manage(0, 1, "broker.status"), p.Ping()],
    ids=lambda x: type(x).__name__,
)
def test_packet_before_hello(brokers: Factory, packet: p.Packet) -> None:
    with guarded(brokers) as (b, _good), Raw(b.port) as raw:
        raw.send(p.MAGIC + p.encode(packet))
        err = raw.expect_error_and_close()
        assert err.code == ErrorCode.PROTOCOL
        assert "HELLO" in err.message


@pytest.mark.parametrize(
    "packet",
    [p.CloseSession(1, 1), p.Flow(1, 1, 100), p.Send(1, 1, msgspec.Raw(packb([GOOD_Q]))), p.Ack(1, 1, 1, 1)],
    ids=lambda x: type(x).__name__,
)
def test_session_command_before_hello(brokers: Factory, packet: p.Packet) -> None:
    """HELLO must come first: a session command before it is a connection error, never executed or answered."""
    with guarded(brokers) as (b, _good), Raw(b.port) as raw:
        raw.send(p.MAGIC + p.encode(packet))
        raw.expect_error_and_close()


@pytest.mark.parametrize("version", [0, p.PROTOCOL_VERSION + 1, 2**31])
def test_wrong_protocol_version(brokers: Factory, version: int) -> None:
    with guarded(brokers) as (b, _good), Raw(b.port) as raw:
        raw.send(p.MAGIC + p.encode(p.Hello(version)))
        err = raw.expect_error_and_close()
        assert err.code == ErrorCode.VERSION_MISMATCH
        assert str(version) in err.message


MALFORMED: list[tuple[str, bytes]] = [
    ("invalid msgpack", frame(b"\xc1\xc1\xc1")),
    ("truncated msgpack", frame(b"\x94\x0a\x01")),
    ("not an array", frame(packb({"t": 10, "channel": 1}))),
    ("empty array", frame(packb([]))),
    ("string tag", frame(packb(["hello", 1]))),
    ("wrong field type", frame(packb([10, "one", 1]))),
    ("missing fields", frame(packb([10]))),
    ("manage args not a map", frame(packb([20, 0, 1, "broker.status", [1, 2]]))),
    ("send without its message", frame(packb([12, 1, 2]))),
    ("empty frame", p.LENGTH.pack(0)),
    ("second HELLO", p.encode(p.Hello(p.PROTOCOL_VERSION))),
]


def test_malformed_packets(brokers: Factory) -> None:
    with guarded(brokers) as (b, _good):
        for name, data in MALFORMED:
            with Raw(b.port) as raw:
                raw.hello()
                raw.send(data)
                err = raw.expect_error_and_close()
                assert err.code == ErrorCode.PROTOCOL, (name, err)


def test_many_bad_connections_leave_nothing_behind(brokers: Factory) -> None:
    bad = [
        b"GARBAGE!",
        p.MAGIC + p.encode(p.Hello(1)) + p.LENGTH.pack(MAX_FRAME * 4),
        p.MAGIC + p.encode(p.Hello(1)) + frame(packb([99])),
        p.MAGIC + frame(b"\xc1"),
        p.MAGIC + p.encode(p.Hello(7)),
    ]
    with guarded(brokers) as (b, _good):
        assert_connections(b.url, 1)  # the good client
        for i in range(40):
            with Raw(b.port) as raw:
                raw.send(bad[i % len(bad)])
                raw.expect_error_and_close()
        assert_connections(b.url, 1)


# ---------------------------------------------------------- command errors
def test_command_errors_keep_the_connection(brokers: Factory) -> None:
    """Missing queue / address with auto-create off: a typed exception, and the same connection goes on."""
    with guarded(brokers) as (b, _good), tandem.connect(b.url) as conn:
        conn.manage("queue.create", name="present")
        session = conn.session()
        with pytest.raises(tandem.QueueDoesNotExist) as qe:
            session.create_consumer("missing-queue")
        assert qe.value.code == ErrorCode.QUEUE_DOES_NOT_EXIST
        assert "missing-queue" in qe.value.message
        prod = session.create_producer("missing-address")
        with pytest.raises(tandem.AddressDoesNotExist) as ae:
            prod.send(b"nowhere")
        assert ae.value.code == ErrorCode.ADDRESS_DOES_NOT_EXIST
        assert "missing-address" in ae.value.message
        assert not conn.closed
        # the same connection, session and producer still work
        prod.send(b"somewhere", address="present")
        cons = session.create_consumer("present")
        msg = cons.receive(timeout=IO_TIMEOUT)
        assert msg is not None and msg.body == b"somewhere"
        with pytest.raises(tandem.AddressDoesNotExist):
            prod.send(b"nowhere again")
        prod.send(b"again", address="present")
        msg = cons.receive(timeout=IO_TIMEOUT)
        assert msg is not None and msg.body == b"again"
        [stat] = conn.manage("queue.stat", name="present")
        assert stat["messages_added"] == 2
        names = {r["name"] for r in conn.manage("queue.stat")}
        assert "missing-queue" not in names and "missing-address" not in names


def test_bad_management_calls_raise_invalid_argument(brokers: Factory) -> None:
    with guarded(brokers) as (b, _good), tandem.connect(b.url) as conn:
        with pytest.raises(tandem.InvalidArgument, match=r"no\.such\.op"):
            conn.manage("no.such.op")
        with pytest.raises(tandem.InvalidArgument, match="colour"):
            conn.manage("queue.create", name="q1", colour="blue")
        with pytest.raises(tandem.InvalidArgument, match="name"):
            conn.manage("queue.create", name=5)
        with pytest.raises(tandem.InvalidArgument):
            conn.manage("queue.create")  # `name` missing
        with pytest.raises(tandem.InvalidArgument, match="routing"):
            conn.manage("queue.create", name="q1", routing_type="broadcast")
        with pytest.raises(tandem.QueueDoesNotExist):
            conn.manage("queue.delete", name="q1")
        assert not conn.closed
        assert conn.manage("queue.create", name="q1")["name"] == "q1"  # still usable
        assert conn.manage("broker.status")["name"] == "b"


def test_ill_typed_routing_types_is_invalid_argument(brokers: Factory) -> None:
    """`address.create` with routing_types=[1]: a client mistake, so INVALID_ARGUMENT, not INTERNAL."""
    with guarded(brokers) as (b, _good), tandem.connect(b.url) as conn:
        with pytest.raises(tandem.InvalidArgument):
            conn.manage("address.create", name="a1", routing_types=[1])
        assert not conn.closed
        assert "a1" not in {a["name"] for a in conn.manage("address.list")}


def test_command_errors_over_raw_socket(brokers: Factory) -> None:
    """EXCEPTION names the failed command's channel and id; the connection stays in sync."""
    with guarded(brokers) as (b, _good), Raw(b.port) as raw:
        raw.hello()
        raw.send(p.encode(p.CreateSession(1, 1)))
        assert raw.next() == p.Response(1, 1, None)
        raw.send(p.encode(p.CreateConsumer(1, 2, 1, "missing")))
        exc = raw.next()
        assert isinstance(exc, p.Exception_), exc
        assert (exc.channel, exc.cmd, exc.code) == (1, 2, ErrorCode.QUEUE_DOES_NOT_EXIST)
        raw.send(p.encode(p.Send(1, 3, msgspec.Raw(packb("not a message")))))
        exc = raw.next()
        assert isinstance(exc, p.Exception_), exc
        assert (exc.channel, exc.cmd, exc.code) == (1, 3, ErrorCode.INVALID_ARGUMENT)
        raw.send(p.encode(p.CreateSession(1, 4)))  # channel already in use
        exc = raw.next()
        assert isinstance(exc, p.Exception_) and (exc.cmd, exc.code) == (4, ErrorCode.ILLEGAL_STATE), exc
        raw.send(p.encode(p.Ack(7, 1, 1, 1)))  # no session on channel 7
        exc = raw.next()
        assert isinstance(exc, p.Exception_) and (exc.channel, exc.code) == (7, ErrorCode.SESSION_DOES_NOT_EXIST)
        raw.send(p.encode(p.Manage(0, 1, "queue.purge", {"name": "missing"})))
        exc = raw.next()
        assert isinstance(exc, p.Exception_) and (exc.channel, exc.cmd) == (0, 1), exc
        assert exc.code == ErrorCode.QUEUE_DOES_NOT_EXIST
        raw.expect_open()


def test_bad_sends_inside_one_burst(brokers: Factory) -> None:
    """SENDs of one write reach the core as runs; a malformed one, one to a missing address
    and one on a channel without a session each get their own EXCEPTION, in order, and every
    good SEND around them is confirmed and kept, in the order sent."""
    with guarded(brokers) as (b, _good):
        with tandem.connect(b.url) as conn:
            conn.manage("queue.create", name="burst", exists_ok=True)
        with Raw(b.port) as raw:
            raw.hello()
            raw.send(p.encode(p.CreateSession(1, 1)))
            assert raw.next() == p.Response(1, 1, None)
            good = [MessageData("burst", True, body=b"m%d" % i) for i in range(6)]
            burst = [
                p.encode(p.SendData(1, 2, good[0])),
                p.encode(p.SendData(1, 3, good[1])),
                p.encode(p.Send(1, 4, msgspec.Raw(packb("not a message")))),
                p.encode(p.SendData(1, 5, good[2])),
                p.encode(p.SendData(1, 6, MessageData("nowhere", True, body=b"x"))),
                p.encode(p.SendData(9, 1, good[3])),  # no session on channel 9
                p.encode(p.SendData(1, 7, good[4])),
                p.encode(p.SendData(1, 8, good[5])),
            ]
            raw.send(b"".join(burst))
            errors: list[tuple[int, int, int]] = []
            upto = 0
            for _ in range(20):
                pkt = raw.next()
                if isinstance(pkt, p.Exception_):
                    errors.append((pkt.channel, pkt.cmd, pkt.code))
                elif isinstance(pkt, p.Confirm):
                    assert pkt.channel == 1 and pkt.upto >= upto
                    upto = pkt.upto
                if upto == 8 and len(errors) == 3:
                    break
            assert errors == [
                (1, 4, ErrorCode.INVALID_ARGUMENT),
                (1, 6, ErrorCode.ADDRESS_DOES_NOT_EXIST),
                (9, 1, ErrorCode.SESSION_DOES_NOT_EXIST),
            ]
            assert upto == 8
            raw.expect_open()
    # guarded() ended with a kill -9 and a restart: what was confirmed is there, in order
    with tandem.connect(b.url) as conn:
        cons = conn.session().create_consumer("burst")
        got = [m.body for m in iter(lambda: cons.receive(timeout=1.0), None)]
    assert got == [b"m0", b"m1", b"m2", b"m4", b"m5"]


def test_ill_typed_routing_type_in_message_is_invalid_argument(brokers: Factory) -> None:
    """A SEND whose message carries routing_type 7 to a new address: INVALID_ARGUMENT, nothing created."""
    auto = {"#": {"auto_create_queues": True, "auto_create_addresses": True}}
    with guarded(brokers, address_settings=auto) as (b, _good):
        with Raw(b.port) as raw:
            raw.hello()
            raw.send(p.encode(p.CreateSession(1, 1)))
            assert raw.next() == p.Response(1, 1, None)
            data = MessageData("fresh", True, routing_type=7, body=b"x")
            raw.send(p.encode(p.SendData(1, 2, data)))
            exc = raw.next()
            assert isinstance(exc, p.Exception_), exc
            assert exc.code == ErrorCode.INVALID_ARGUMENT, exc
            raw.expect_open()
        with tandem.connect(b.url) as conn:
            assert "fresh" not in {a["name"] for a in conn.manage("address.list")}


# ------------------------------------------------------------- stalled peers
def test_half_frames_that_stall_do_not_block_others(brokers: Factory) -> None:
    with guarded(brokers) as (b, good):
        with Raw(b.port) as half_magic, Raw(b.port) as half_prefix, Raw(b.port) as half_body:
            half_magic.send(p.MAGIC[:2])
            half_prefix.hello()
            half_prefix.send(p.LENGTH.pack(MAX_FRAME - 10)[:2])
            cs = p.encode(p.CreateSession(1, 1))
            half_body.hello()
            half_body.send(cs[:5])
            # while all three sit mid-frame, the good client keeps going, and so do new connections
            good.wait_rounds(good.rounds + 30)
            with tandem.connect(b.url) as other:
                other.manage("queue.create", name="other")
                s = other.session()
                s.create_producer("other").send(b"hi")
                msg = s.create_consumer("other").receive(timeout=IO_TIMEOUT)
                assert msg is not None and msg.body == b"hi"
            assert_connections(b.url, 4)  # the good client and the three stalled ones: nobody was dropped
            # each stalled connection resumes exactly where it stopped
            half_body.send(cs[5:])
            assert half_body.next() == p.Response(1, 1, None)
            half_body.expect_open()
            half_magic.send(p.MAGIC[2:] + p.encode(p.Hello(p.PROTOCOL_VERSION)))
            assert isinstance(half_magic.next(), p.HelloOk)
            half_prefix.send(p.LENGTH.pack(MAX_FRAME - 10)[2:] + b"\xc1" * (MAX_FRAME - 10))
            assert half_prefix.expect_error_and_close().code == ErrorCode.PROTOCOL


def test_stalled_connections_are_dropped_after_connection_ttl(brokers: Factory) -> None:
    """Stalled peers do not hold on for ever: after connection-ttl they get ERROR(CONNECTION_LOST) and a close.

    An idle but well-behaved client answers the broker's pings and stays connected.
    """
    with guarded(brokers, connection_ttl=1000, connection_check_period=100) as (b, _good):
        with Raw(b.port) as stalled, Raw(b.port) as mute, tandem.connect(b.url) as idle:
            stalled.hello()
            stalled.send(p.encode(p.CreateSession(1, 1))[:5])
            mute.send(p.MAGIC[:2])
            t0 = time.monotonic()
            for raw in (stalled, mute):
                err = raw.expect_error_and_close(timeout=5.0)
                assert err.code == ErrorCode.CONNECTION_LOST, err
            assert time.monotonic() - t0 >= 0.5  # dropped by the TTL, not at once
            time.sleep(max(0.0, t0 + 2.5 - time.monotonic()))  # the idle client has now been idle for 2.5 TTLs
            assert not idle.closed
            assert idle.manage("broker.status")["name"] == "b"


def test_reattach_that_cannot_be_honoured_or_makes_no_sense(brokers: Factory) -> None:
    """REATTACH without a window, of an unknown id, and with nonsense counts: refused or done
    without harm, the connection answers on, the broker serves everyone else."""
    with guarded(brokers) as (b, _good):
        with Raw(b.port) as raw:
            raw.hello()
            raw.send(p.encode(p.Reattach("nobody")))
            r = raw.next()
            assert isinstance(r, p.Reattached) and not r.ok and "confirmation window" in r.reason, r
            raw.expect_open()

        def windowed(raw: Raw, conn_id: str) -> None:
            raw.send(p.MAGIC + p.encode(p.Hello(1, client_name="t", confirmation_window=64, connection_id=conn_id)))
            assert isinstance(raw.next(), p.HelloOk)

        with Raw(b.port) as lone:
            windowed(lone, "never-seen")
            lone.send(p.encode(p.Reattach("never-seen", [p.ReattachChannel(1, 1, [(1, 1, 1)])])))
            r = lone.next()
            assert isinstance(r, p.Reattached) and not r.ok and "no such connection" in r.reason, r
            lone.expect_open()

        with Raw(b.port) as first, Raw(b.port) as second:
            windowed(first, "raw-1")
            first.send(p.encode(p.Manage(0, 1, "queue.create", {"name": "raw-q"})))
            first.send(p.encode(p.CreateSession(1, 1)))
            first.send(p.encode(p.CreateConsumer(1, 2, 7, "raw-q")))
            got = [first.next() for _ in range(3)]
            assert all(isinstance(x, (p.Response, p.Received)) for x in got), got
            windowed(second, "raw-1")
            nonsense = [(7, -5, -100), (99, 10**12, 10**12)]
            second.send(p.encode(p.Reattach("raw-1", [p.ReattachChannel(0, 0), p.ReattachChannel(1, 0, nonsense)])))
            r = second.next()
            assert isinstance(r, p.Reattached) and r.ok and r.last == {0: 1, 1: 2}, r
            # awaited_from 0: every answer it kept comes again, then a CONFIRM; then it answers on
            again = [second.next() for _ in range(4)]
            assert [(type(x).__name__, getattr(x, "cmd", None)) for x in again] == [
                ("Response", 1),
                ("Response", 1),
                ("Response", 2),
                ("Confirm", None),
            ], again
            second.expect_open()
            second.send(p.encode(p.CloseSession(1, 3)))
            for _ in range(20):  # the answers it got again first, then this one
                pkt = second.next()
                if isinstance(pkt, p.Response) and pkt.cmd == 3:
                    break
            else:
                pytest.fail("no answer to CLOSE_SESSION")


def test_reattach_naming_a_session_closed_long_ago_is_refused(brokers: Factory) -> None:
    """Its last command id is forgotten (only the latest closed sessions' are kept): replaying
    its commands could open it again, so the broker refuses and lets the old sessions go."""
    with guarded(brokers) as (b, _good), Raw(b.port) as first, Raw(b.port) as second:
        hello = p.Hello(1, client_name="t", confirmation_window=1 << 20, connection_id="many")
        first.send(p.MAGIC + p.encode(hello))
        assert isinstance(first.next(), p.HelloOk)
        n = 300
        for ch in range(1, n + 1):
            first.send(p.encode(p.CreateSession(ch, 1)) + p.encode(p.CloseSession(ch, 2)))
        answers = [first.next() for _ in range(2 * n)]
        assert all(isinstance(x, p.Response) for x in answers)
        first.send(p.encode(p.CreateSession(n + 1, 1)))  # one open: the connection is kept for a reattach
        assert isinstance(first.next(), p.Response)
        second.send(p.MAGIC + p.encode(hello))
        assert isinstance(second.next(), p.HelloOk)
        second.send(p.encode(p.Reattach("many", [p.ReattachChannel(1, 2), p.ReattachChannel(n + 1, -1)])))
        r = second.next()
        assert isinstance(r, p.Reattached) and not r.ok and "not kept" in r.reason, r
        second.expect_open()
        assert_connections(b.url, 2)  # `second` and the guard's client: `first` was let go
