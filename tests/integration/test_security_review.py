"""Review of issue 17 as a whole: ways around a permission check, against real broker processes.

Each test here showed one defect found in review (each failed before its fix) and now guards it. Users come from
tests/secured.py; the security-settings give the user `app` everything on `#` and the user
`nobody` only `view` on the management address (so it can log in and nothing else).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
import pytest

import tandem
import tandem.aio as aio
from broker_process import BrokerProcess
from secured import password_of, secured, url_for
from tandem.certs import DevCerts, write_dev_certs
from tandem.core.message import MessageData
from tandem.protocol import native as p

Factory = Callable[..., BrokerProcess]

EVERYTHING = (
    '[security-settings."#"]\n'
    'send = ["app"]\nconsume = ["app"]\nbrowse = ["app"]\n'
    'create-address = ["app"]\ndelete-address = ["app"]\n'
    'create-durable-queue = ["app"]\ndelete-durable-queue = ["app"]\n'
    'create-non-durable-queue = ["app"]\ndelete-non-durable-queue = ["app"]\n'
    'manage = ["app"]\n'
    '[security-settings."tandem.management"]\nview = ["app", "nobody"]\nmanage = ["app"]\n'
)
USERS = {"app": ["app"], "nobody": ["nobody"]}


def test_adopting_an_existing_durable_queue_as_temporary_needs_no_permission_and_deletes_it(
    broker_factory: Factory, tmp_path: Path
) -> None:
    """`queue.create` with exists_ok returns before any permission check when the queue exists,
    and then, with temporary=true, the EXISTING queue is put in the caller's temporary queues
    (admin.queue_create): when the caller disconnects, the broker deletes it with force=true.
    So a user without any permission deletes another user's durable queue and its messages."""
    b = broker_factory(**secured(tmp_path, USERS, EVERYTHING)).start()
    with tandem.connect(url_for(b.url, "app")) as conn:
        conn.manage("queue.create", name="orders")
        with conn.session() as s:
            s.create_producer("orders").send(b"order 1", durable=True)
    with tandem.connect(url_for(b.url, "nobody")) as conn:
        try:
            conn.manage("queue.create", name="orders", exists_ok=True, temporary=True)
        except tandem.Unauthorized:
            pass  # refusing is one right answer; adopting the queue is not
    with tandem.connect(url_for(b.url, "app")) as conn:
        stats = conn.manage("queue.stat")
        names = {q["name"]: q for q in stats}
        assert "orders" in names, f"the durable queue was deleted by a user without permissions: {stats}"
        with conn.session() as s:
            m = s.create_consumer("orders").receive(timeout=5)
            assert m is not None and m.body == b"order 1"


def _tls_acceptor(certs: DevCerts, trust: Path) -> str:
    return (
        '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\nssl-enabled = true\n'
        f'cert-path = "{certs.server}"\nkey-path = "{certs.server_key}"\ntrust-store-path = "{trust}"\n'
    )


class RawTls:
    """A native connection, packet by packet (over TLS with a client certificate when given); reads bounded."""

    def __init__(self, port: int, ca: Path | None = None, cert: Path | None = None, key: Path | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if ca is not None:
            ctx = ssl.create_default_context(cafile=str(ca))
            if cert is not None:
                ctx.load_cert_chain(str(cert), str(key))
            sock = ctx.wrap_socket(sock, server_hostname="127.0.0.1")
        self.sock = sock
        self.reader = p.FrameReader(p.ServerPacket, 1 << 24, expect_magic=False)
        self.got: list[Any] = []

    def send(self, *packets: p.Packet, magic: bool = False) -> None:
        self.sock.sendall((p.MAGIC if magic else b"") + b"".join(p.encode(x) for x in packets))

    def until(self, want: Callable[[Any], bool], timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            for x in self.got:
                if want(x):
                    return x
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except (TimeoutError, ssl.SSLError, OSError):
                return None
            if not data:
                return None
            self.got.extend(self.reader.feed(data))

    def close(self) -> None:
        self.sock.close()


def test_a_session_cannot_be_reattached_by_another_certificate_user(broker_factory: Factory, tmp_path: Path) -> None:
    """REATTACH compares the HELLO user names (server/native.py on_reattach: `old.username !=
    self.username`), not who logged in: two clients that log in by certificate (cert-user-mapping)
    send no user name, so one takes over the other's live connection, and its sessions keep the
    owner's permissions. The connection id it needs is the client's uuid, which every durable
    message it sends carries in its dedup id (auto_dedup), so any consumer of its messages has it."""
    app = write_dev_certs(tmp_path / "app")  # CN tandem-client -> user app
    ops = write_dev_certs(tmp_path / "ops", client_cn="ops-1")  # -> user ops
    trust = tmp_path / "trust.pem"
    trust.write_bytes(app.ca.read_bytes() + ops.ca.read_bytes())
    settings = (
        '[[cert-user-mapping]]\nuser = "app"\ncn = "tandem-client"\n'
        '[[cert-user-mapping]]\nuser = "ops"\ncn = "ops-1"\n'
        '[security-settings."#"]\nsend = ["app"]\nconsume = ["app"]\n'
        '[security-settings."shared"]\nsend = ["app"]\nconsume = ["app", "ops"]\n'
        '[[addresses]]\nname = "shared"\n[[addresses.queues]]\nname = "shared"\n'
        '[[addresses]]\nname = "secret"\n[[addresses.queues]]\nname = "secret"\n'
    )
    b = broker_factory(**secured(tmp_path, {"app": ["app"], "ops": ["ops"]}, settings + _tls_acceptor(app, trust)))
    b.start()
    q = f"ca={quote(str(app.ca))}&cert={quote(str(app.client))}&key={quote(str(app.client_key))}"
    with tandem.connect(f"tcps://127.0.0.1:{b.port}?{q}&confirmation_window_size=65536") as conn:
        s = conn.session()
        s.create_producer("secret").send(b"for app only", durable=True)
        s.create_producer("shared").send(b"hello ops", durable=True)
        # ops consumes from `shared`, as it may, and reads app's connection id off the message
        ops_conn = RawTls(b.port, app.ca, ops.client, ops.client_key)
        try:
            ops_conn.send(p.Hello(p.PROTOCOL_VERSION, client_name="ops"), magic=True)
            assert ops_conn.until(lambda x: isinstance(x, p.HelloOk)) is not None, ops_conn.got
            ops_conn.send(p.CreateSession(1, 1), p.CreateConsumer(1, 2, 1, "shared", window=-1))
            d = ops_conn.until(lambda x: isinstance(x, p.Deliver))
            assert d is not None, ops_conn.got
            dedup = msgspec.msgpack.decode(bytes(d.message), type=MessageData).dedup_id
            assert dedup is not None
            conn_id = dedup.split(":")[0]
            ops_conn.close()
            # ops again, with app's connection id: it must not get app's sessions
            thief = RawTls(b.port, app.ca, ops.client, ops.client_key)
            try:
                thief.send(
                    p.Hello(p.PROTOCOL_VERSION, client_name="ops", confirmation_window=65536, connection_id=conn_id),
                    magic=True,
                )
                assert thief.until(lambda x: isinstance(x, p.HelloOk)) is not None, thief.got
                thief.send(p.Reattach(conn_id, []))
                answer = thief.until(lambda x: isinstance(x, p.Reattached))
                assert answer is not None, thief.got
                # With app's session (channel 1), ops reads the queue only app may consume.
                thief.send(p.CreateConsumer(1, 1000, 9, "secret", window=-1))
                stolen = thief.until(lambda x: isinstance(x, p.Deliver), timeout=3)
                assert not answer.ok, f"user ops took over user app's connection; it then read {stolen!r}"
                assert stolen is None
            finally:
                thief.close()
        finally:
            ops_conn.close()


def test_a_user_without_permissions_cannot_spend_another_users_transaction_id(
    broker_factory: Factory, tmp_path: Path
) -> None:
    """Transaction dedup ids live in one cache for the whole broker (core/dedup.py TX_CACHE), and
    committing an empty transaction needs no permission, yet records its id. A user who may do
    nothing commits another user's next id first; that user's commit then answers "already
    committed" and its messages are dropped, while its client reports success. The client's own
    ids are `<client uuid>:tx:<channel>:<n>` (auto_dedup), the uuid readable off its messages."""
    b = broker_factory(**secured(tmp_path, USERS, EVERYTHING)).start()
    with tandem.connect(url_for(b.url, "app")) as conn:
        conn.manage("queue.create", name="payments")
    with tandem.connect(url_for(b.url, "nobody")) as conn, conn.session(transacted=True) as s:
        try:
            s.commit(dedup_id="payments-batch-7")  # nothing in it: no permission is asked for
        except tandem.Unauthorized:
            pass
    with tandem.connect(url_for(b.url, "app")) as conn:
        with conn.session(transacted=True) as s:
            s.create_producer("payments").send(b"pay 100", durable=True)
            s.commit(dedup_id="payments-batch-7")  # succeeds, as far as app can tell
        with conn.session() as s:
            m = s.create_consumer("payments").receive(timeout=3)
            assert m is not None and m.body == b"pay 100", (
                "a committed message was dropped: its id was spent by another user"
            )


def test_range_reads_tell_whether_a_queue_exists_only_to_who_may_consume_there(
    broker_factory: Factory, tmp_path: Path
) -> None:
    """READ_RANGE and ACK_UP_TO look the queue up before the `consume` check (server/native.py),
    so a user who may not consume there learns which queue names exist: QUEUE_DOES_NOT_EXIST
    for a missing one, UNAUTHORIZED for an existing one. A consumer, `queue.stat` and
    `queue.delete` check the name first and answer UNAUTHORIZED either way (commit 2a2b93b)."""
    b = broker_factory(**secured(tmp_path, USERS, EVERYTHING)).start()

    async def attempt(op: str) -> BaseException | None:
        conn = await aio.connect(url_for(b.url, "nobody"))
        try:
            s = await conn.create_session()
            if op == "read":
                await s.read_range("no.such.queue", 0, 10)
            else:
                await s.ack_upto("no.such.queue", 10)
        except tandem.TandemError as exc:
            return exc
        finally:
            await conn.close()
        return None

    for op in ("read", "ack"):
        got = asyncio.run(attempt(op))
        assert isinstance(got, tandem.Unauthorized), f"{op}: a user without `consume` is told {got!r}"


def test_credit_requests_waiting_on_a_full_address_go_with_their_connection(broker_factory: Factory) -> None:
    """A producer's REQUEST_CREDITS on a full BLOCK address waits in the address's `blocked`
    list (core/address.py request_credit): one entry per request, with no bound per connection,
    and nothing takes a closed connection's entries out, so each closed client's requests (and,
    through their callbacks, its connection object) stay until the address has room again, which
    may be never. One client leaves as many as it sends."""
    b = broker_factory(address_settings={"full": {"max-size-bytes": 1000, "address-full-policy": "BLOCK"}}).start()
    with tandem.connect(b.url) as conn, conn.session() as s:
        s.create_producer("full").send(b"x" * 2000)  # over max-size-bytes: the address is full
    n = 5000
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as raw:
        hello = p.Hello(p.PROTOCOL_VERSION, client_name="t")
        packets = [p.CreateSession(1, 1)] + [p.RequestCredits(1, 2 + i, "full", 1000) for i in range(n)]
        raw.sendall(p.MAGIC + p.encode(hello) + b"".join(p.encode(x) for x in packets))
        time.sleep(1.0)  # let the broker read them (none is answered: the address is full)
    deadline = time.monotonic() + 5
    with tandem.connect(b.url) as conn:
        while True:
            row = next(a for a in conn.manage("address.list") if a["name"] == "full")
            if row["blocked_producers"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert row["blocked_producers"] == 0, f"a closed connection's credit requests still wait: {row}"


def _login(port: int, user: str, conn_id: str) -> RawTls:
    r = RawTls(port)
    r.send(
        p.Hello(
            p.PROTOCOL_VERSION,
            username=user,
            password=password_of(user),
            client_name="t",
            confirmation_window=65536,
            connection_id=conn_id,
        ),
        magic=True,
    )
    assert r.until(lambda x: isinstance(x, p.HelloOk)) is not None, r.got
    return r


def test_another_user_cannot_take_a_connection_id_away_from_its_owner(broker_factory: Factory, tmp_path: Path) -> None:
    """A connection id is registered for a reattach by whoever says it last (HELLO, then
    CREATE_SESSION sets `broker.reattachable[id]`), whatever user it is. A user who knows
    another's id (every auto-dedup message carries it) says it and opens a session: the owner's
    REATTACH after its socket failed then finds the other user's connection under its id and
    is refused ("belongs to another user"), and its sessions are lost."""
    b = broker_factory(**secured(tmp_path, USERS, EVERYTHING)).start()
    conn_id = "0123456789abcdef0123456789abcdef"
    owner = _login(b.port, "app", conn_id)
    owner.send(p.CreateSession(1, 1))
    assert owner.until(lambda x: isinstance(x, p.Response) and x.channel == 1) is not None, owner.got
    owner.close()  # the owner's socket fails: its session waits for a reattach (its TTL)
    time.sleep(0.3)
    other = _login(b.port, "nobody", conn_id)
    try:
        other.send(p.CreateSession(1, 1))
        assert other.until(lambda x: isinstance(x, p.Response) and x.channel == 1) is not None, other.got
        back = _login(b.port, "app", conn_id)
        try:
            back.send(p.Reattach(conn_id, [p.ReattachChannel(1, -1)]))
            answer = back.until(lambda x: isinstance(x, p.Reattached))
            assert answer is not None, back.got
            assert answer.ok, f"the owner could not reattach its own sessions: {answer.reason}"
        finally:
            back.close()
    finally:
        other.close()


STOMP_ACCEPTOR = '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
NATIVE_ACCEPTOR = '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'


def _stomp_until(sock: socket.socket, needle: bytes, timeout: float = 10.0) -> bytes:
    got = b""
    deadline = time.monotonic() + timeout
    while needle not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"no {needle!r} from the broker; got {got!r}"
        sock.settimeout(left)
        data = sock.recv(65536)
        assert data, f"closed before {needle!r}; got {got!r}"
        got += data
    return got


def test_creations_by_a_send_and_a_durable_unsubscribe_are_audited(broker_factory: Factory, tmp_path: Path) -> None:
    """The audit log is to have a line for every creation and deletion (issue 17), but only
    management operations, logins, denials and a consumer's or SUBSCRIBE's auto-created queue
    write one: an address and queue auto-created by a producer's send (native or STOMP), and a
    durable subscription ended by STOMP UNSUBSCRIBE (its queue deleted), leave no line."""
    settings = secured(tmp_path, USERS, EVERYTHING + NATIVE_ACCEPTOR + STOMP_ACCEPTOR)
    b = broker_factory(audit_log=True, log_level="warning", **settings).start()
    with tandem.connect(url_for(b.url, "app")) as conn, conn.session() as s:
        s.create_producer("made.by.native.send").send(b"x")
    with socket.create_connection(("127.0.0.1", b.ports["stomp"]), timeout=10) as st:
        st.sendall(f"CONNECT\naccept-version:1.2\nhost:x\nlogin:app\npasscode:{password_of('app')}\n\n\0".encode())
        _stomp_until(st, b"CONNECTED")
        st.sendall(b"SEND\ndestination:/queue/made.by.stomp.send\nreceipt:s1\n\nx\0")
        _stomp_until(st, b"receipt-id:s1")
        st.sendall(b"DISCONNECT\nreceipt:d\n\n\0")
        _stomp_until(st, b"receipt-id:d")
    with socket.create_connection(("127.0.0.1", b.ports["stomp"]), timeout=10) as st:
        connect = f"CONNECT\naccept-version:1.2\nhost:x\nlogin:app\npasscode:{password_of('app')}\nclient-id:c1\n\n\0"
        st.sendall(connect.encode())
        _stomp_until(st, b"CONNECTED")
        st.sendall(b"SUBSCRIBE\nid:1\ndestination:/topic/news\ndurable-subscription-name:d1\nreceipt:r1\n\n\0")
        _stomp_until(st, b"receipt-id:r1")
        st.sendall(b"UNSUBSCRIBE\nid:1\ndurable-subscription-name:d1\nreceipt:r2\n\n\0")
        _stomp_until(st, b"receipt-id:r2")
    with tandem.connect(url_for(b.url, "app")) as conn:
        assert "c1.d1" not in {q["name"] for q in conn.manage("queue.stat")}  # the subscription ended
        conn.manage("broker.status")  # (the lines above are written by now)
    lines = [line for line in b.log_text().splitlines() if " tandem.audit: " in line]
    wanted = (
        ("target=made.by.native.send ", "allowed=yes"),
        ("target=made.by.stomp.send ", "allowed=yes"),
        ("event=queue.delete ", "target=c1.d1 "),
    )
    missing = [needles for needles in wanted if not any(all(n in line for n in needles) for line in lines)]
    assert not missing, f"no audit line with {missing}:\n" + "\n".join(lines)


def test_a_refused_cluster_announce_is_audited_as_refused(broker_factory: Factory, tmp_path: Path) -> None:
    """cluster.announce with a wrong cluster pair closes the connection (admin.cluster_announce
    calls conn.fatal and returns), so Admin.handle sees no exception and writes the attempt to
    the audit log as `allowed=yes`: a guess at the cluster password reads as a success."""
    settings = secured(tmp_path, USERS, EVERYTHING)
    b = broker_factory(audit_log=True, log_level="warning", **settings).start()
    with tandem.connect(url_for(b.url, "app")) as conn:
        node_id = conn.manage("broker.status")["node_id"]
    conn = tandem.connect(url_for(b.url, "nobody"), reconnect_attempts=0)
    try:
        conn.manage("cluster.announce", user="tandem.cluster", password="guess", node_id=node_id, connector="x:1")
    except tandem.TandemError:
        pass  # refused, and the connection closed
    finally:
        try:
            conn.close()
        except tandem.TandemError:
            pass
    with tandem.connect(url_for(b.url, "app")) as c2:
        c2.manage("broker.status")  # (the lines above are written by now)
    lines = [line for line in b.log_text().splitlines() if " tandem.audit: " in line and "cluster.announce" in line]
    assert lines, b.log_text()
    assert all("allowed=no" in line for line in lines), "\n".join(lines)


def test_a_large_send_denied_in_a_transaction_rolls_it_back(broker_factory: Factory, tmp_path: Path) -> None:
    """A denied send rolls its transaction back (test_permissions: "a denied send in a
    transaction rolls it back"), but a large message denied at LARGE_BEGIN (server/large.py
    begin: the Unauthorized goes into the upload and END answers it) never marks the
    transaction failed, so the commit applies the transaction's other sends."""
    settings = '[security-settings."tx.ok.#"]\nsend = ["app"]\nconsume = ["app"]\n'
    decl = '[[addresses]]\nname = "tx.ok"\n[[addresses.queues]]\nname = "tx.ok"\n'
    decl += '[[addresses]]\nname = "tx.no"\n[[addresses.queues]]\nname = "tx.no"\n'
    b = broker_factory(**secured(tmp_path, {"app": ["app"]}, decl + settings)).start()

    async def go() -> bool:
        conn = await aio.connect(url_for(b.url, "app") + "&min_large_message_size=1024")
        try:
            s = await conn.create_session(transacted=True)
            await s.create_producer("tx.ok").send(b"kept?")
            denied = s.create_producer("tx.no").send_nowait(b"x" * 200_000)  # a large message
            assert denied is not None
            with pytest.raises(tandem.Unauthorized, match=r"'send' on address 'tx.no'"):
                await denied
            try:
                await s.commit()
            except tandem.TransactionRolledBack:
                return False
            return True
        finally:
            await conn.close()

    committed = asyncio.run(go())
    with tandem.connect(url_for(b.url, "app")) as conn, conn.session() as s:
        leaked = s.create_consumer("tx.ok").receive(timeout=1)
    assert not committed and leaked is None, f"commit after a denied large send: {committed}, applied: {leaked!r}"


def test_a_stomp_subscription_to_a_missing_topic_honours_auto_create_addresses(broker_factory: Factory) -> None:
    """SUBSCRIBE to a topic that does not exist made its address even where `auto-create-addresses`
    is false (the subscription's queue was created with the address as a side effect)."""
    b = broker_factory(
        address_settings={"news.#": {"auto-create-addresses": False}}, extra_toml=STOMP_ACCEPTOR + NATIVE_ACCEPTOR
    ).start()
    with socket.create_connection(("127.0.0.1", b.ports["stomp"]), timeout=10) as st:
        st.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\0")
        _stomp_until(st, b"CONNECTED")
        st.sendall(b"SUBSCRIBE\nid:1\ndestination:/topic/news.sport\nreceipt:r1\n\n\0")
        got = _stomp_until(st, b"\0")
        assert got.startswith(b"ERROR") and b"news.sport" in got, got
    with tandem.connect(b.url) as conn:
        assert "news.sport" not in {a["name"] for a in conn.manage("address.list")}


def test_a_temporary_queue_is_consumed_only_by_the_connection_that_made_it(
    broker_factory: Factory, tmp_path: Path
) -> None:
    """A temporary queue (a reply queue) is its connection's, as JMS says: another connection,
    even with `consume` on its address, may send to it but not consume, browse or range-read it."""
    b = broker_factory(**secured(tmp_path, USERS, EVERYTHING)).start()

    async def go() -> None:
        owner = await aio.connect(url_for(b.url, "app"))
        other = await aio.connect(url_for(b.url, "app"))
        try:
            s = await owner.create_session()
            await s.create_queue("replies.1", temporary=True)
            o = await other.create_session()
            await o.create_producer("replies.1").send(b"reply")  # sending to it is fine
            with pytest.raises(tandem.TandemError, match="another connection"):
                await o.create_consumer("replies.1")
            with pytest.raises(tandem.TandemError, match="another connection"):
                await o.read_range("replies.1", 0, 10)
            c = await s.create_consumer("replies.1")
            m = await c.receive(5)
            assert m is not None and m.body == b"reply"
        finally:
            await other.close()
            await owner.close()

    asyncio.run(go())
