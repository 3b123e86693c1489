"""Text that is not UTF-8, over real sockets against a broker process, while a good client works.

A packet whose text is not UTF-8 is malformed like any other: before or at the handshake, and
for any packet but SEND, the connection gets one ERROR (PROTOCOL) and is closed; a SEND whose
message has such text fails alone with its own EXCEPTION (INVALID_ARGUMENT) and the connection
goes on. The broker writes at most one log line per bad connection and no traceback, and a
client connected meanwhile (the GoodClient of test_bad_input) keeps sending, receiving and
acknowledging durable messages; at the end, a kill -9 and restart loses nothing it kept.
STOMP gets the same checks: an ERROR frame, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from test_bad_input import SETTINGS, Raw, frame, guarded
from test_stomp import STOMP_ACCEPTORS, assert_error_then_closed
from test_stomp import Raw as StompRaw

import tandem
from bad_utf8 import BAD_UTF8, BadStr, pack, replaced
from broker_process import BrokerProcess
from tandem.core.message import MessageData
from tandem.errors import ErrorCode
from tandem.protocol import native as p

Factory = Callable[..., BrokerProcess]
# The reproducer of issue 13: a HELLO (tag 1, version 1, no client id) whose user name is the
# byte 0xff. (The issue wrote the length big-endian; the wire's is little-endian.)
REPRODUCER = p.MAGIC + p.LENGTH.pack(6) + bytes.fromhex("9401 01c0 a1ff")


@pytest.fixture
def brokers(broker_factory: Factory) -> Factory:
    def make(**settings: Any) -> BrokerProcess:
        return broker_factory(**{**SETTINGS, **settings})  # type: ignore[no-any-return]

    return make


def bad(packet: p.Packet, field: int, text: bytes = b"\xff") -> bytes:
    """`packet` framed, with its field number `field` (0 is the tag) sent as invalid UTF-8."""
    generic = msgspec.msgpack.decode(p.encode(packet)[4:])
    return frame(pack(replaced(generic, (("item", field),), text)))


def manage_with_bad_arg_name() -> bytes:
    return frame(pack([20, 0, 1, "queue.create", {"name": "q", BadStr(b"\xc0\x80"): True}]))


# (name, HELLO first?, bytes)
BAD_PACKETS: list[tuple[str, bool, bytes]] = [
    ("hello-client-id", False, p.MAGIC + bad(p.Hello(1, "cid", "u", "pw", "app"), 2)),
    ("hello-username", False, p.MAGIC + bad(p.Hello(1, "cid", "u", "pw", "app"), 3, b"\xed\xa0\x80")),
    ("hello-password", False, p.MAGIC + bad(p.Hello(1, "cid", "u", "pw", "app"), 4, b"pass\xe2\x82")),
    ("hello-client-name", False, p.MAGIC + bad(p.Hello(1, "cid", "u", "pw", "app"), 5, b"\x80")),
    ("create-session-name", True, bad(p.CreateSession(1, 1, False, "s"), 4)),
    ("create-consumer-queue", True, bad(p.CreateConsumer(1, 1, 1, "q"), 4)),
    ("create-consumer-filter", True, bad(p.CreateConsumer(1, 1, 1, "q", "a = 1"), 5, b"a = '\xf4\x90\x80\x80'")),
    ("manage-op", True, bad(p.Manage(0, 1, "broker.status"), 3)),
    ("manage-arg-name", True, manage_with_bad_arg_name()),
    ("commit-dedup-id", True, bad(p.Commit(1, 1, "tx"), 3)),
    ("request-credits-address", True, bad(p.RequestCredits(1, 1, "a", 10), 3)),
    ("read-range-queue", True, bad(p.ReadRange(1, 1, "q", 0, 1), 3)),
    ("ack-up-to-queue", True, bad(p.AckUpTo(1, 1, "q", 1), 3)),
    ("client-error-message", True, bad(p.Error(2, "bye"), 2)),
]


def log_window(b: BrokerProcess) -> int:
    return len(b.log_text().splitlines())


def assert_quiet_log(b: BrokerProcess, since: int, peers: list[str]) -> None:
    """No traceback anywhere; since line `since`, every line names one of `peers`, each at most once."""
    text = b.log_text()
    assert "Traceback" not in text and "Fatal error" not in text, text[-3000:]
    lines = text.splitlines()[since:]
    for line in lines:
        assert any(peer in line for peer in peers), f"a log line for none of the bad connections: {line!r}"
    for peer in peers:
        n = sum(peer in line for line in lines)
        assert n <= 1, f"{n} log lines for {peer}: {[ln for ln in lines if peer in ln]}"


def peer_of(raw: Raw | StompRaw) -> str:
    host, port = raw.sock.getsockname()[:2]
    return f"{host}:{port}"


def test_the_reproducer_gets_an_error_packet(brokers: Factory) -> None:
    with guarded(brokers) as (b, _good):
        since = log_window(b)
        with Raw(b.port) as raw:
            peer = peer_of(raw)
            raw.send(REPRODUCER)
            err = raw.expect_error_and_close()
        assert err.code == ErrorCode.PROTOCOL
        assert "UTF-8" in err.message
        assert_quiet_log(b, since, [peer])


def test_a_burst_of_bad_packets_one_log_line_per_connection(brokers: Factory) -> None:
    """120 connections, each closed for one packet with invalid UTF-8 (every kind, in turn)."""
    with guarded(brokers) as (b, good):
        since = log_window(b)
        peers = []
        for i in range(120):
            name, after_hello, data = BAD_PACKETS[i % len(BAD_PACKETS)]
            with Raw(b.port) as raw:
                peers.append(peer_of(raw))
                if after_hello:
                    raw.hello()
                raw.send(data)
                err = raw.expect_error_and_close()
                assert err.code == ErrorCode.PROTOCOL, (name, err)
                assert "UTF-8" in err.message, (name, err)
        good.wait_rounds(good.rounds + 10)  # the good client still goes on, without an error
        assert_quiet_log(b, since, peers)


def message(address: str = "burst", **fields: Any) -> MessageData:
    return MessageData(address, True, **fields)


def bad_message(field: int, text: bytes, data: MessageData) -> msgspec.Raw:
    """`data` encoded, with its field number `field` (or a property name, for -1) as invalid UTF-8."""
    generic = msgspec.msgpack.decode(msgspec.msgpack.encode(data))
    if field == -1:
        generic[7] = {BadStr(text): 1}
        return msgspec.Raw(pack(generic))
    return msgspec.Raw(pack(replaced(generic, (("item", field),), text)))


def test_bad_messages_in_a_burst_fail_only_their_sends(brokers: Factory) -> None:
    """SENDs of one write: those whose message has invalid UTF-8 (address, dedup id, a property's
    name or value) each get their own EXCEPTION, in order; every good SEND around them is confirmed
    and kept, and the connection stays open."""
    with guarded(brokers) as (b, _good):
        with tandem.connect(b.url) as conn:
            conn.manage("queue.create", name="burst", exists_ok=True)
        since = log_window(b)
        with Raw(b.port) as raw:
            raw.hello()
            raw.send(p.encode(p.CreateSession(1, 1)))
            assert raw.next() == p.Response(1, 1, None)
            good = [message(body=b"m%d" % i) for i in range(5)]
            prop = message(properties={"k": "v"}, body=b"x")
            burst = [
                p.encode(p.SendData(1, 2, good[0])),
                p.encode(p.Send(1, 3, bad_message(0, b"burst\xff", message(body=b"x")))),
                p.encode(p.SendData(1, 4, good[1])),
                p.encode(p.Send(1, 5, bad_message(5, BAD_UTF8[3], message(dedup_id="d", body=b"x")))),
                p.encode(p.Send(1, 6, bad_message(-1, BAD_UTF8[2], prop))),
                p.encode(p.SendData(1, 7, good[2])),
                p.encode(p.Send(1, 8, msgspec.Raw(pack(["burst", True, 4, 0, 0, None, 0, {"k": BadStr(b"\x80")}])))),
                p.encode(p.SendData(1, 9, good[3])),
                p.encode(p.SendData(1, 10, good[4])),
            ]
            raw.send(b"".join(burst))
            errors: list[tuple[int, int, int]] = []
            upto = 0
            for _ in range(30):
                pkt = raw.next()
                if isinstance(pkt, p.Exception_):
                    assert "UTF-8" in pkt.message, pkt
                    errors.append((pkt.channel, pkt.cmd, pkt.code))
                elif isinstance(pkt, p.Confirm):
                    upto = max(upto, pkt.upto)
                if upto == 10 and len(errors) == 4:
                    break
            assert errors == [(1, cmd, ErrorCode.INVALID_ARGUMENT) for cmd in (3, 5, 6, 8)]
            assert upto == 10
            raw.expect_open()
        assert_quiet_log(b, since, [])
    # guarded() ended with a kill -9 and a restart: the confirmed messages are there, in order
    with tandem.connect(b.url) as conn:
        cons = conn.session().create_consumer("burst")
        got = [m.body for m in iter(lambda: cons.receive(timeout=1.0), None)]
    assert got == [b"m0", b"m1", b"m2", b"m3", b"m4"]


# ---------------------------------------------------------------------------- STOMP
DEST = b"destination:/queue/utf8\n"
AUTO_CREATE = {"#": {"auto_create_queues": True, "auto_create_addresses": True}}
# (name, CONNECT first with this version or None, bytes)
STOMP_BAD: list[tuple[str, str | None, bytes]] = [
    ("connect-login", None, b"CONNECT\naccept-version:1.2\nhost:x\nlogin:\xff\npasscode:p\n\n\0"),
    ("connect-1.0-passcode", None, b"CONNECT\nlogin:u\npasscode:\xc0\x80\n\n\0"),
    ("command", "1.2", b"SEN\xc4\n" + DEST + b"\nx\0"),
    ("command-no-eol-yet", "1.2", b"\xff\xfe"),
    ("header-name", "1.2", b"SEND\n" + DEST + b"\xed\xa0\x80:v\n\nx\0"),
    ("destination", "1.2", b"SEND\ndestination:/queue/\xff\n\nx\0"),
    ("destination-1.0", "1.0", b"SEND\ndestination:/queue/\x80\n\nx\0"),
    ("subscribe-id", "1.2", b"SUBSCRIBE\nid:\xe2\x82\n" + DEST + b"\n\0"),
    ("ack-id-fast-path", "1.2", b"ACK\nid:1.\xff\n\n\0"),
    ("ack-id-general-path", "1.2", b"ACK\nid:1.2\xff\nreceipt:r\n\n\0"),
    ("transaction", "1.1", b"BEGIN\ntransaction:t\xf4\x90\x80\x80\n\n\0"),
    ("crlf-header-value", "1.2", b"SEND\r\n" + DEST[:-1] + b"\r\nk:\xff\r\n\r\nx\0"),
    ("after-good-frames", "1.2", b"SEND\n" + DEST + b"\nfine\0SEND\n" + DEST + b"k:\xff\n\nx\0"),
    ("escaped-header", "1.2", b"SEND\n" + DEST + b"k:a\\c\xff\n\nx\0"),
]


def test_stomp_invalid_utf8_gets_an_error_frame(brokers: Factory) -> None:
    """60 STOMP connections with invalid UTF-8 (each case of STOMP_BAD in turn), while a STOMP
    client sends, receives and acknowledges: an ERROR frame each, one log line at most each, no
    traceback."""
    with guarded(brokers, extra_toml=STOMP_ACCEPTORS, address_settings=AUTO_CREATE) as (b, good):
        since = log_window(b)
        peers = []
        ok = StompRaw(b.ports["stomp"])
        try:
            ok.connect("1.2")
            ok.send(b"SUBSCRIBE\nid:s\ndestination:/queue/fine\nack:client-individual\n\n\0")
            for i in range(60):
                name, version, data = STOMP_BAD[i % len(STOMP_BAD)]
                r = StompRaw(b.ports["stomp"])
                try:
                    peers.append(peer_of(r))
                    if version is not None:
                        r.connect(version)
                    r.send(data)
                    err = assert_error_then_closed(r, "UTF-8|unknown command")
                    assert err.headers["message"], name
                finally:
                    r.close()
                ok.send(f"SEND\ndestination:/queue/fine\nreceipt:r{i}\n\nm{i}\0".encode())
                ok.next_of("RECEIPT", **{"receipt-id": f"r{i}"})
                m = ok.next_of("MESSAGE")
                assert m.body == f"m{i}".encode()
                ok.send(f"ACK\nid:{m.headers['ack']}\n\n\0".encode())
        finally:
            ok.close()
        good.wait_rounds(good.rounds + 10)
        assert_quiet_log(b, since, peers)


def test_a_send_whose_body_is_text_is_refused_and_consumers_get_the_rest(brokers: Factory) -> None:
    """A message body must be msgpack bin. One sent as text (invalid UTF-8 or not) was accepted,
    since the broker decodes only the header, and then failed every consumer it reached: a STOMP
    subscription's delivery raised (the message stuck, a traceback), a native client's decoder
    dropped its connection. Now that SEND alone gets INVALID_ARGUMENT, and a STOMP subscriber
    and a native consumer get the good messages around it."""
    with guarded(brokers, extra_toml=STOMP_ACCEPTORS, address_settings=AUTO_CREATE) as (b, _good):
        with Raw(b.port) as raw:
            raw.hello()
            raw.send(p.encode(p.CreateSession(1, 1)))
            assert raw.next() == p.Response(1, 1, None)
            header = [True, 4, 0, 0, None, 1]  # durable, priority, expiration, timestamp, dedup id, anycast
            burst = []
            for queue in ("to-stomp", "to-native"):
                burst += [
                    pack([queue, *header, None, b"first"]),
                    pack([queue, *header, None, BadStr(b"\xff\xfe")]),
                    pack([queue, *header, None, "valid text, but text"]),
                    pack([queue, *header, None, b"second"]),
                ]
            raw.send(b"".join(p.encode(p.Send(1, 2 + i, msgspec.Raw(m))) for i, m in enumerate(burst)))
            errors, upto = [], 0
            for _ in range(30):
                pkt = raw.next()
                if isinstance(pkt, p.Exception_):
                    errors.append((pkt.cmd, pkt.code))
                elif isinstance(pkt, p.Confirm):
                    upto = max(upto, pkt.upto)
                if upto == 9:  # every command done (an EXCEPTION goes out at once, a CONFIRM after the sync)
                    break
            assert errors == [(cmd, ErrorCode.INVALID_ARGUMENT) for cmd in (3, 4, 7, 8)]
            assert upto == 9
        r = StompRaw(b.ports["stomp"])
        try:
            r.connect("1.2")
            r.send(b"SUBSCRIBE\nid:s\ndestination:/queue/to-stomp\n\n\0")
            assert [m.body for m in r.messages(2)] == [b"first", b"second"]
        finally:
            r.close()
        with tandem.connect(b.url) as conn:
            cons = conn.session().create_consumer("to-native")
            got = [m.body for m in iter(lambda: cons.receive(timeout=1.0), None)]
            assert got == [b"first", b"second"]
            assert not conn.closed
        assert "Traceback" not in b.log_text()
