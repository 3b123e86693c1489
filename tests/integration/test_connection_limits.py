"""Deadlines and limits a client cannot talk its way around, over real sockets to real brokers.

A connection must finish its handshake within `handshake-timeout` (stray bytes do not count),
every frame must complete within the connection's TTL (however it is trickled), a client cannot
ask for an unbounded TTL or heart-beat, and before login a frame is small. Plus the STOMP odds
and ends: content-length is ASCII digits, SUBSCRIBE errors name SUBSCRIBE, open transactions
are bounded, an error does not send a client's 1 MB name back, failed logins are logged at
warning without flooding the log. After each, the broker still serves a well-behaved client.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tandem
from broker_process import BrokerProcess
from tandem.errors import ErrorCode
from tandem.protocol import native as p
from tandem.protocol.stomp import SERVER_COMMANDS, Frame, StompParser
from users import users_path, write_users

ACCEPTORS = (
    '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
    '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
)
TTL = 1000  # ms: the `plain` broker's connection-ttl (a frame must complete within it)
HANDSHAKE = 300  # ms: the `timed` broker's handshake-timeout
TTL_MAX = 2000  # ms: the `timed` broker's connection-ttl-max (the longest TTL a client may ask for)
PRE_LOGIN_LIMIT = 64 * 1024  # bytes: the largest frame before the handshake
MAX_TRANSACTIONS = 100  # open STOMP transactions per connection
CLOSE_WITHIN = 6.0  # s: bound on every wait for the broker to close a connection
BIG = 1_000_000  # characters of a name the broker must not send back whole

Factory = Callable[..., BrokerProcess]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A short connection-ttl (and a fast check) so that per-frame deadlines show within a second."""
    b = BrokerProcess(
        tmp_path_factory.mktemp("limits") / "plain",
        name="plain",
        extra_toml=ACCEPTORS,
        connection_ttl=TTL,
        connection_check_period=100,
    )
    b.start()
    yield b
    b.kill()


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A short handshake-timeout and TTL cap, so the tests of them stay fast."""
    b = BrokerProcess(
        tmp_path_factory.mktemp("limits") / "timed",
        name="timed",
        extra_toml=ACCEPTORS,
        handshake_timeout=HANDSHAKE,
        connection_ttl=1500,
        connection_ttl_max=TTL_MAX,
        connection_check_period=100,
    )
    b.start()
    yield b
    b.kill()


def assert_serving(b: BrokerProcess) -> None:
    """A well-behaved native client still sends and receives (and the process lives)."""
    assert b.running
    with tandem.connect(b.url) as conn:
        session = conn.session()
        session.create_producer("limits.bystander").send(b"still here")
        got = session.create_consumer("limits.bystander").receive(timeout=5)
        assert got is not None and got.body == b"still here"


# --------------------------------------------------------------------------- raw sockets
class Wire:
    """A raw connection: bytes out, the broker's frames (native packets or STOMP frames) in."""

    def __init__(self, port: int, stomp: bool) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.stomp = stomp
        self.native = p.FrameReader(p.ServerPacket, 1 << 26, expect_magic=False)
        self.parser = StompParser(1 << 26, "1.0", SERVER_COMMANDS)
        self.got: list[Any] = []
        self.raw = 0  # bytes received
        self.eof = False

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> bool:
        """False once the broker has closed the connection."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def read(self, timeout: float) -> None:
        """Whatever arrives within `timeout` (stops early at EOF)."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                return
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                return
            self.raw += len(data)
            self.got += self.parser.feed(data) if self.stomp else self.native.feed(data)

    def next(self, timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            for i, x in enumerate(self.got):
                if not isinstance(x, p.Ping) and not (isinstance(x, Frame) and x.command == "HEARTBEAT"):
                    del self.got[: i + 1]
                    return x
            self.got.clear()
            assert not self.eof, "the broker closed the connection"
            left = deadline - time.monotonic()
            assert left > 0, "no frame from the broker"
            self.read(min(left, 0.2))

    def closed_with_error(self, timeout: float = CLOSE_WITHIN) -> Any:
        """Read up to EOF (within `timeout`): the last thing sent must be one ERROR."""
        self.read(timeout)
        assert self.eof, f"the broker did not close the connection within {timeout}s; got {self.got!r}"
        errors = [x for x in self.got if isinstance(x, p.Error) or (isinstance(x, Frame) and x.command == "ERROR")]
        assert len(errors) == 1 and self.got[-1] is errors[0], f"expected one ERROR, then the close: {self.got!r}"
        return errors[0]

    def trickle(self, data: bytes, every: float = 0.1, seconds: float = CLOSE_WITHIN) -> float:
        """Send `data` one byte at a time, `every` s apart, until the broker closes (or `seconds` pass)."""
        t0 = time.monotonic()
        for i in range(len(data)):
            if time.monotonic() - t0 > seconds or not self.send(data[i : i + 1]):
                break
            self.read(every)
            if self.eof:
                break
        return time.monotonic() - t0

    # native
    def hello(self, **kw: Any) -> p.HelloOk:
        self.send(p.MAGIC + p.encode(p.Hello(p.PROTOCOL_VERSION, client_name="limits", **kw)))
        ok = self.next()
        assert isinstance(ok, p.HelloOk), ok
        return ok

    # stomp
    def connect(self, **headers: str) -> Frame:
        lines = "".join(f"{k}:{v}\n" for k, v in {"accept-version": "1.2", "host": "x", **headers}.items())
        self.send(f"CONNECT\n{lines}\n\0".encode())
        f = self.next()
        assert f.command == "CONNECTED", f
        self.parser.version = "1.2"
        return f


@pytest.fixture
def wires() -> Iterator[Callable[[int, bool], Wire]]:
    made: list[Wire] = []

    def make(port: int, stomp: bool) -> Wire:
        w = Wire(port, stomp)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def message_of(err: Any) -> str:
    return str(err.message if isinstance(err, p.Error) else err.headers.get("message", ""))


# ================================================================ handshake-timeout (timed)


def test_native_handshake_must_complete_within_handshake_timeout(
    timed: BrokerProcess, wires: Callable[[int, bool], Wire]
) -> None:
    """Silent, half a magic, or a HELLO trickled a byte at a time: closed once handshake-timeout is past."""
    port = timed.ports["native"]
    silent, half, slow = wires(port, False), wires(port, False), wires(port, False)
    half.send(p.MAGIC[:2])
    hello = p.MAGIC + p.encode(p.Hello(p.PROTOCOL_VERSION, client_name="x" * 200))
    took = slow.trickle(hello, every=0.05)
    assert took < CLOSE_WITHIN, "a HELLO trickled a byte every 50 ms held the connection"
    for w in (silent, half, slow):
        err = w.closed_with_error()
        assert err.code == ErrorCode.PROTOCOL and "handshake-timeout" in err.message, err
    ok = wires(port, False)
    ok.hello()
    ok.read(1.0)  # more than the handshake-timeout: a handshaken connection stays
    assert not ok.eof
    assert_serving(timed)


def test_stomp_stray_newlines_do_not_hold_a_connection_before_connect(
    timed: BrokerProcess, wires: Callable[[int, bool], Wire]
) -> None:
    """EOLs before CONNECT are not heart-beats: a client that never logs in is closed at handshake-timeout."""
    port = timed.ports["stomp"]
    beats, slow, silent = wires(port, True), wires(port, True), wires(port, True)
    took = beats.trickle(b"\n" * 200, every=0.05)
    assert took < CLOSE_WITHIN, "newlines every 50 ms held a connection that never sent CONNECT"
    took = slow.trickle(b"CONNECT\naccept-version:1.2\nhost:" + b"x" * 200 + b"\n\n\0", every=0.05)
    assert took < CLOSE_WITHIN, "a CONNECT trickled a byte every 50 ms held the connection"
    for w in (beats, slow, silent):
        assert "handshake-timeout" in message_of(w.closed_with_error())
    ok = wires(port, True)
    ok.connect(**{"heart-beat": "0,0"})
    ok.read(1.0)
    assert not ok.eof
    ok.send(b"SEND\ndestination:/queue/limits.stomp\nreceipt:r1\n\nhi\0")
    assert ok.next().command == "RECEIPT"


# ======================================================= a TTL a client may choose is capped


def test_native_client_cannot_choose_an_unbounded_ttl(timed: BrokerProcess, wires: Callable[[int, bool], Wire]) -> None:
    w = wires(timed.ports["native"], False)
    ok = w.hello(connection_ttl=10**12)
    assert ok.connection_ttl == TTL_MAX, ok
    shorter = wires(timed.ports["native"], False).hello(connection_ttl=TTL_MAX // 2)
    assert shorter.connection_ttl == TTL_MAX // 2  # below the cap: taken as asked
    err = w.closed_with_error(timeout=TTL_MAX / 1000 + CLOSE_WITHIN)  # silent past the cap
    assert err.code == ErrorCode.CONNECTION_LOST, err


def test_stomp_client_cannot_choose_an_unbounded_heart_beat(
    timed: BrokerProcess, wires: Callable[[int, bool], Wire]
) -> None:
    w = wires(timed.ports["stomp"], True)
    connected = w.connect(**{"heart-beat": f"{10**12},0"})
    sx, sy = (int(x) for x in connected.headers["heart-beat"].split(","))
    assert sx == 0 and 0 < sy <= TTL_MAX, connected.headers
    err = w.closed_with_error(timeout=TTL_MAX / 1000 + CLOSE_WITHIN)  # silent past the cap
    assert re.search("heart-beat|frame", message_of(err)), err
    for bad in ("٣,0", "+5,0", "0x5,0", f"{'9' * 5000},0"):
        b = wires(timed.ports["stomp"], True)
        b.send(f"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:{bad}\n\n\0".encode())
        assert "heart-beat" in message_of(b.closed_with_error())
    assert_serving(timed)


# ============================================================ a frame completes within the TTL


def test_native_packet_trickled_a_byte_at_a_time_is_cut_at_the_ttl(
    plain: BrokerProcess, wires: Callable[[int, bool], Wire]
) -> None:
    w = wires(plain.ports["native"], False)
    w.hello()  # the broker's connection-ttl (TTL ms): every byte alone would keep the connection
    packet = p.encode(p.Manage(0, 1, "broker.status", {"pad": "x" * 5000}))
    took = w.trickle(packet, every=0.1)
    assert took < CLOSE_WITHIN, f"a packet trickled for {took:.1f}s was never cut"
    err = w.closed_with_error()
    assert "not complete" in err.message, err
    assert_serving(plain)


def test_stomp_frame_trickled_a_byte_at_a_time_is_cut_at_the_ttl(
    plain: BrokerProcess, wires: Callable[[int, bool], Wire]
) -> None:
    w = wires(plain.ports["stomp"], True)
    w.connect()  # no heart-beat: the broker's connection-ttl
    took = w.trickle(b"SEND\ndestination:/queue/limits.trickle\n\n" + b"x" * 5000 + b"\0", every=0.1)
    assert took < CLOSE_WITHIN, f"a frame trickled for {took:.1f}s was never cut"
    assert "not complete" in message_of(w.closed_with_error())
    assert_serving(plain)


# ======================================================== before login, frames are small


def test_native_frame_over_the_pre_login_limit_is_refused_at_once(
    plain: BrokerProcess, wires: Callable[[int, bool], Wire]
) -> None:
    w = wires(plain.ports["native"], False)
    w.send(p.MAGIC + p.LENGTH.pack(PRE_LOGIN_LIMIT + 1))  # only the length: refused before the body comes
    err = w.closed_with_error()  # today's TTL would close it too, but with CONNECTION_LOST
    assert err.code == ErrorCode.FRAME_TOO_LARGE and str(PRE_LOGIN_LIMIT) in err.message, err
    # After HELLO (even in the same write) a frame may be as large as max-frame-size.
    ok = wires(plain.ports["native"], False)
    big = p.encode(p.Manage(0, 1, "broker.status", {"pad": "x" * (2 * PRE_LOGIN_LIMIT)}))
    ok.send(p.MAGIC + p.encode(p.Hello(p.PROTOCOL_VERSION)) + big)
    assert isinstance(ok.next(), p.HelloOk)
    answer = ok.next()
    assert isinstance(answer, (p.Response, p.Exception_)), answer  # answered, not refused for its size
    assert_serving(plain)


def test_stomp_frame_over_the_pre_login_limit_is_refused_at_once(
    plain: BrokerProcess, wires: Callable[[int, bool], Wire]
) -> None:
    w = wires(plain.ports["stomp"], True)
    w.send(b"CONNECT\naccept-version:1.2\nhost:x\npad:" + b"x" * (PRE_LOGIN_LIMIT + 10))  # no header end yet
    err = w.closed_with_error()
    assert str(PRE_LOGIN_LIMIT) in message_of(err), err
    body = b"y" * (2 * PRE_LOGIN_LIMIT)
    ok = wires(plain.ports["stomp"], True)
    ok.send(
        b"CONNECT\naccept-version:1.2\nhost:x\n\n\0"
        + b"SEND\ndestination:/queue/limits.big\nreceipt:r\ncontent-length:%d\n\n%s\0" % (len(body), body)
    )
    assert ok.next().command == "CONNECTED"
    ok.parser.version = "1.2"
    assert ok.next().command == "RECEIPT"


# ============================================================================ STOMP details


@pytest.mark.parametrize("length", ["\u0663", "\uff13", "+3", " 3", "3 ", "0x3", "3.0", ""])
def test_stomp_content_length_is_ascii_digits_only(
    plain: BrokerProcess, wires: Callable[[int, bool], Wire], length: str
) -> None:
    w = wires(plain.ports["stomp"], True)
    w.connect()
    w.send(f"SEND\ndestination:/queue/limits.cl\nreceipt:r\ncontent-length:{length}\n\nabc\0".encode())
    assert "content-length" in message_of(w.closed_with_error())


def test_subscribe_without_destination_names_subscribe(
    plain: BrokerProcess, wires: Callable[[int, bool], Wire]
) -> None:
    w = wires(plain.ports["stomp"], True)
    w.connect()
    w.send(b"SUBSCRIBE\nid:1\n\n\0")
    text = message_of(w.closed_with_error())
    assert "SUBSCRIBE" in text and "SEND" not in text, text


def test_open_stomp_transactions_per_connection_are_bounded(
    plain: BrokerProcess, wires: Callable[[int, bool], Wire]
) -> None:
    w = wires(plain.ports["stomp"], True)
    w.connect()
    w.send(b"".join(b"BEGIN\ntransaction:t%d\n\n\0" % i for i in range(MAX_TRANSACTIONS)))
    w.send(b"COMMIT\ntransaction:t0\nreceipt:c\n\n\0")
    assert w.next().command == "RECEIPT"  # the limit is on open ones: a closed one makes room
    w.send(b"BEGIN\ntransaction:again\nreceipt:b\n\n\0")
    assert w.next().command == "RECEIPT"
    w.send(b"BEGIN\ntransaction:one-too-many\nreceipt:b2\n\n\0")
    text = message_of(w.closed_with_error())
    assert str(MAX_TRANSACTIONS) in text and "transaction" in text, text
    assert_serving(plain)


def test_errors_do_not_send_a_huge_name_back(plain: BrokerProcess, wires: Callable[[int, bool], Wire]) -> None:
    """A 1 MB name in a request: the error names it, shortened, over native and STOMP, and in the log."""
    big = "n" * BIG
    log_before = len(plain.log_text())
    with tandem.connect(plain.url) as conn:
        with pytest.raises(tandem.QueueDoesNotExist) as info:
            conn.manage("queue.stat", name=big)
        assert 0 < len(info.value.message) < 2000, len(info.value.message)
        assert info.value.message.startswith("queue 'nnn"), info.value.message[:100]
        assert info.value.message.endswith("does not exist"), info.value.message[-100:]
    w = wires(plain.ports["stomp"], True)
    w.connect()
    w.send(f"BEGIN\ntransaction:{big}\n\n\0".encode() + f"BEGIN\ntransaction:{big}\n\n\0".encode())
    err = w.closed_with_error()
    assert "already open" in message_of(err) and len(message_of(err)) < 2000
    assert len(err.body) < 2000 and w.raw < 8000, (len(err.body), w.raw)
    assert len(plain.log_text()) - log_before < 50_000
    assert_serving(plain)


# =============================================================== failed logins (own broker)


def test_failed_logins_are_logged_at_warning_and_rate_limited(
    broker_factory: Factory, wires: Callable[[int, bool], Wire]
) -> None:
    b = broker_factory(
        security_enabled=True,
        cluster_password="pair-secret",
        log_level="warning",
        login_failure_delay=0,  # the delay has its own test (test_users.py): here, only the log
        extra_toml=ACCEPTORS + '[security-settings."#"]\nview = ["ops"]\n',
    )
    write_users(users_path(b), {"app": ("secret", ["ops"])})
    b.start()
    for i in range(10):
        w = wires(b.ports["native"], False)
        w.send(p.MAGIC + p.encode(p.Hello(p.PROTOCOL_VERSION, username=f"mallory{i}", password="guess-native")))
        assert w.closed_with_error().code == ErrorCode.UNAUTHORIZED
        s = wires(b.ports["stomp"], True)
        s.send(f"CONNECT\naccept-version:1.2\nhost:x\nlogin:eve{i}\npasscode:guess-stomp\n\n\0".encode())
        assert "authentication failed" in message_of(s.closed_with_error())
    with tandem.connect(f"{b.url}?username=app&password=secret") as conn:  # the log is written by now
        assert conn.manage("broker.status")["state"] == "active"
    log = b.log_text()
    lines = [line for line in log.splitlines() if re.search("login|authentication", line)]
    assert lines, f"no failed login was logged at warning:\n{log}"
    assert all(" warning " in line for line in lines), lines
    assert len(lines) <= 2, f"20 failed logins in a burst gave {len(lines)} log lines:\n{log}"
    assert "mallory0" in lines[0] and "127.0.0.1" in lines[0], lines
    assert "guess" not in log and "secret" not in log
