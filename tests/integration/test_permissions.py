"""security-settings against real broker processes: every permission, over native and STOMP.

Each permission has its own pattern (`p.<permission>.#`) that grants it to the role `yes` only;
the user `no` (role `no`) is refused there with UNAUTHORIZED naming the permission and the
address, and its connection goes on (it may still read the broker's status: `view` on the
management address). Users come from tests/secured.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp

import tandem
import tandem.aio as aio
from broker_process import BrokerProcess
from secured import password_of, secured, url_for

Factory = Callable[..., BrokerProcess]
ACCEPTORS = (
    '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
    '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
)
PERMISSIONS = (
    "send",
    "consume",
    "browse",
    "create-address",
    "delete-address",
    "create-durable-queue",
    "delete-durable-queue",
    "create-non-durable-queue",
    "delete-non-durable-queue",
    "manage",
    "view",
    "edit",
)
USERS = {"yes": ["yes"], "no": ["no"], "feeder": ["feeder"], "admin": ["admin"]}


def _list(*roles: str) -> str:
    return "[" + ", ".join(f'"{r}"' for r in roles) + "]"


def _settings() -> str:
    out = ['[security-settings."#"]\n' + "".join(f"{perm} = {_list('admin')}\n" for perm in PERMISSIONS)]
    for perm in PERMISSIONS:
        lines = [f'[security-settings."p.{perm}.#"]', f"{perm} = {_list('yes')}"]
        if perm != "send":
            lines.append(f"send = {_list('feeder')}")
        out.append("\n".join(lines) + "\n")
    out.append(
        '[security-settings."tandem.management"]\n'
        f"view = {_list('no', 'yes')}\n"  # every user here may read the status: proves its connection lives on
        f"manage = {_list('admin')}\n"
    )
    return "".join(out)


def _addresses() -> str:
    """Pre-declared addresses and queues, so each operation needs only its own permission."""
    decl = [
        ("p.send.a", [("p.send.a", True)]),
        ("p.consume.a", [("p.consume.a", True)]),
        ("p.browse.a", [("p.browse.a", True)]),
        ("p.delete-address.a", []),
        ("p.create-durable-queue.a", []),
        ("p.create-non-durable-queue.a", []),
        ("p.delete-durable-queue.a", [("p.delete-durable-queue.q", True)]),
        ("p.delete-non-durable-queue.a", [("p.delete-non-durable-queue.q", False)]),
        ("p.manage.a", [("p.manage.q", True)]),
        ("p.view.a", [("p.view.q", True)]),
        ("p.edit.a", [("p.edit.q", True)]),
    ]
    out = []
    for name, queues in decl:
        out.append(f'[[addresses]]\nname = "{name}"\n')
        for q, durable in queues:
            out.append(f'[[addresses.queues]]\nname = "{q}"\ndurable = {"true" if durable else "false"}\n')
    return "".join(out)


@pytest.fixture(scope="module")
def pb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One secured broker for the per-permission tests (each uses names of its own)."""
    tmp = tmp_path_factory.mktemp("perms")
    b = BrokerProcess(tmp / "b", name="b", **secured(tmp, USERS, ACCEPTORS + _addresses() + _settings()))
    b.start()
    yield b
    b.kill()


def connect(b: BrokerProcess, user: str) -> tandem.Connection:
    return tandem.connect(url_for(b.url, user))


def _operation(perm: str, b: BrokerProcess) -> Callable[[tandem.Connection, str], Any]:
    """What needs `perm`, done on a connection; `tag` makes names unique per attempt."""

    def send(conn: tandem.Connection, tag: str) -> Any:
        with conn.session() as s:
            s.create_producer("p.send.a").send(b"x")

    def consume(conn: tandem.Connection, tag: str) -> Any:
        with connect(b, "feeder") as f, f.session() as fs:
            fs.create_producer("p.consume.a").send(tag.encode())
        with conn.session() as s:
            m = s.create_consumer("p.consume.a").receive(timeout=5)  # (a denied attempt's message may come first)
            assert m is not None and m.body.endswith(b"1")
            m.ack()

    def browse(conn: tandem.Connection, tag: str) -> Any:
        with conn.session() as s:
            s.create_browser("p.browse.a")

    def create_address(conn: tandem.Connection, tag: str) -> Any:
        conn.manage("address.create", name=f"p.create-address.{tag}")

    def delete_address(conn: tandem.Connection, tag: str) -> Any:
        conn.manage("address.delete", name="p.delete-address.a")

    def create_durable_queue(conn: tandem.Connection, tag: str) -> Any:
        with conn.session() as s:
            s.create_queue(f"p.create-durable-queue.{tag}", address="p.create-durable-queue.a", durable=True)

    def create_non_durable_queue(conn: tandem.Connection, tag: str) -> Any:
        with conn.session() as s:
            s.create_queue(f"p.cndq.{tag}", address="p.create-non-durable-queue.a", durable=False)

    def delete_durable_queue(conn: tandem.Connection, tag: str) -> Any:
        with conn.session() as s:
            s.delete_queue("p.delete-durable-queue.q")

    def delete_non_durable_queue(conn: tandem.Connection, tag: str) -> Any:
        with conn.session() as s:
            s.delete_queue("p.delete-non-durable-queue.q")

    def manage(conn: tandem.Connection, tag: str) -> Any:
        assert conn.manage("queue.purge", name="p.manage.q") == {"removed": 0}

    def view(conn: tandem.Connection, tag: str) -> Any:
        assert conn.manage("queue.stat", name="p.view.q")[0]["name"] == "p.view.q"

    def edit(conn: tandem.Connection, tag: str) -> Any:
        assert conn.manage("queue.purge", name="p.edit.q") == {"removed": 0}

    return locals()[perm.replace("-", "_")]  # type: ignore[no-any-return]


# The address each operation is checked on (what the error must name).
CHECKED_ON = {
    "send": "p.send.a",
    "consume": "p.consume.a",
    "browse": "p.browse.a",
    "create-address": "p.create-address.",
    "delete-address": "p.delete-address.a",
    "create-durable-queue": "p.create-durable-queue.a",
    "create-non-durable-queue": "p.create-non-durable-queue.a",
    "delete-durable-queue": "p.delete-durable-queue.a",
    "delete-non-durable-queue": "p.delete-non-durable-queue.a",
    "manage": "p.manage.a",
    "view": "p.view.a",
    "edit": "p.edit.a",
}


@pytest.mark.parametrize("perm", PERMISSIONS)
def test_each_permission_over_native(pb: BrokerProcess, perm: str) -> None:
    op = _operation(perm, pb)
    with connect(pb, "no") as conn:
        with pytest.raises(tandem.Unauthorized) as info:
            op(conn, "no1")
        text = str(info.value)
        needed = {"manage": "'manage' or 'edit'", "view": "'manage' or 'view'", "edit": "'manage' or 'edit'"}
        assert needed.get(perm, f"'{perm}'") in text and CHECKED_ON[perm] in text and "'no'" in text, text
        # the connection goes on: the next command on it works
        assert conn.manage("broker.status")["state"] == "active"
    # What "#" grants (every permission, to admin) is not inherited by the specific pattern.
    with connect(pb, "admin") as conn, pytest.raises(tandem.Unauthorized):
        op(conn, "admin1")
    with connect(pb, "yes") as conn:
        op(conn, "yes1")


def test_view_does_not_allow_edits_and_denials_are_logged_once(pb: BrokerProcess) -> None:
    with connect(pb, "yes") as conn:
        for _ in range(5):  # `view` on p.view.#: a purge is an edit
            with pytest.raises(tandem.Unauthorized, match="'manage' or 'edit'"):
                conn.manage("queue.purge", name="p.view.q")
    deadline = time.monotonic() + 5
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = [
            ln
            for ln in pb.log_text().splitlines()
            if "permission denied" in ln and "'yes'" in ln and "'manage' or 'edit' on address 'p.view.a'" in ln
        ]
        if lines:
            break
        time.sleep(0.05)
    assert len(lines) == 1, lines


def test_management_needs_manage(pb: BrokerProcess) -> None:
    """Broker-wide operations are checked on `tandem.management`: `view` reads, stop needs more."""
    with connect(pb, "no") as conn:
        assert conn.manage("broker.status")["state"] == "active"
        with pytest.raises(tandem.Unauthorized, match=r"tandem.management"):
            conn.manage("broker.stop")
    with connect(pb, "feeder") as conn, pytest.raises(tandem.Unauthorized, match="'manage' or 'view'"):
        conn.manage("address.list")
    with connect(pb, "admin") as conn:
        assert any(a["name"] == "p.send.a" for a in conn.manage("address.list"))
    time.sleep(0.2)
    assert pb.running


def test_range_reads_and_ack_up_to_need_consume(pb: BrokerProcess) -> None:
    """The Spark source reads ranges and acknowledges up to an offset: both are consuming."""
    with connect(pb, "feeder") as f, f.session() as fs:
        fs.create_producer("p.consume.a").send(b"ranged")

    async def attempt(user: str) -> tuple[list[bytes], int]:
        conn = await aio.connect(url_for(pb.url, user))
        try:
            s = await conn.create_session()
            got = await s.read_range("p.consume.a", 0, 1_000_000)
            acked = await s.ack_upto("p.consume.a", got.last_seq)
            return [bytes(m.body) for m in got.messages], acked
        finally:
            await conn.close()

    async def ack_only(user: str) -> int:
        conn = await aio.connect(url_for(pb.url, user))
        try:
            return await (await conn.create_session()).ack_upto("p.consume.a", 1_000_000)
        finally:
            await conn.close()

    with pytest.raises(tandem.Unauthorized, match=r"'consume' on address 'p.consume.a'"):
        asyncio.run(attempt("no"))
    with pytest.raises(tandem.Unauthorized, match=r"'consume' on address 'p.consume.a'"):
        asyncio.run(ack_only("no"))
    bodies, acked = asyncio.run(attempt("yes"))
    assert b"ranged" in bodies and acked >= 1, (bodies, acked)


def test_a_large_message_is_refused_before_its_body_is_stored(pb: BrokerProcess) -> None:
    async def go() -> None:
        conn = await aio.connect(url_for(pb.url, "no") + "&min_large_message_size=1024")
        try:
            s = await conn.create_session()
            fut = s.create_producer("p.send.a").send_nowait(b"x" * 200_000)
            assert fut is not None
            with pytest.raises(tandem.Unauthorized, match=r"'send' on address 'p.send.a'"):
                await fut
            assert (await conn.manage("broker.status"))["state"] == "active"
        finally:
            await conn.close()

    asyncio.run(go())
    large = pb.data_dir / "large-messages"
    assert not large.exists() or not [f for f in large.iterdir() if f.is_file()], list(large.iterdir())


# ------------------------------------------------------------------------------ auto-creation


AUTO = (
    '[security-settings."auto.#"]\n'
    'send = ["sender", "maker"]\nconsume = ["reader", "maker"]\n'
    'create-address = ["maker"]\ncreate-durable-queue = ["maker"]\n'
    '[security-settings."#"]\nview = ["admin"]\n'
)


def test_auto_creation_needs_the_create_permissions(broker_factory: Factory, tmp_path: Path) -> None:
    users = {"sender": ["sender"], "reader": ["reader"], "maker": ["maker"], "admin": ["admin"]}
    b = broker_factory(**secured(tmp_path, users, ACCEPTORS + AUTO)).start()
    with connect(b, "sender") as conn, conn.session() as s:
        with pytest.raises(tandem.Unauthorized, match=r"'create-address' on address 'auto.orders'"):
            s.create_producer("auto.orders").send(b"x")
    with connect(b, "reader") as conn, conn.session() as s:
        with pytest.raises(tandem.Unauthorized, match=r"'create-durable-queue' on address 'auto.jobs'"):
            s.create_consumer("auto.jobs")
    with connect(b, "admin") as conn:
        names = {a["name"] for a in conn.manage("address.list")}
        assert not names & {"auto.orders", "auto.jobs"}, names  # nothing was made silently
    with connect(b, "maker") as conn, conn.session() as s:
        s.create_producer("auto.orders").send(b"made")
        m = s.create_consumer("auto.orders").receive(timeout=5)
        assert m is not None and m.body == b"made"
        m.ack()
    # now that it exists, sending needs `send` only
    with connect(b, "sender") as conn, conn.session() as s:
        s.create_producer("auto.orders").send(b"again")


def test_a_denied_send_in_a_transaction_rolls_it_back(broker_factory: Factory, tmp_path: Path) -> None:
    """Sent without asking for credit first (send_nowait), the SEND itself is refused; with a
    credit request first (send), the request is. Either way the commit rolls back."""
    settings = '[security-settings."tx.ok.#"]\nsend = ["app"]\nconsume = ["app"]\n'
    decl = '[[addresses]]\nname = "tx.ok"\n[[addresses.queues]]\nname = "tx.ok"\n'
    decl += '[[addresses]]\nname = "tx.no"\n[[addresses.queues]]\nname = "tx.no"\n'
    b = broker_factory(**secured(tmp_path, {"app": ["app"]}, ACCEPTORS + decl + settings)).start()

    async def go() -> None:
        conn = await aio.connect(url_for(b.url, "app"))
        try:
            s = await conn.create_session(transacted=True)
            await s.create_producer("tx.ok").send(b"kept?")
            denied = s.create_producer("tx.no").send_nowait(b"denied")
            assert denied is not None
            with pytest.raises(tandem.Unauthorized, match=r"'send' on address 'tx.no'"):
                await denied
            with pytest.raises(tandem.TransactionRolledBack, match=r"'send' on address 'tx.no'"):
                await s.commit()
            # A producer that asks for credit first is refused at that request: the same outcome.
            await s.create_producer("tx.ok").send(b"kept this time?")
            with pytest.raises(tandem.Unauthorized, match=r"'send' on address 'tx.no'"):
                await s.create_producer("tx.no").send(b"denied")
            with pytest.raises(tandem.TransactionRolledBack, match=r"'send' on address 'tx.no'"):
                await s.commit()
            # the connection goes on, and nothing of either transaction was applied
            r = await conn.create_session()
            c = await r.create_consumer("tx.ok")
            assert await c.receive(timeout=0.5) is None
        finally:
            await conn.close()

    asyncio.run(go())


def test_a_send_refused_on_the_send_path_leaves_the_connection_usable(pb: BrokerProcess) -> None:
    """Without a credit request first (send_nowait) the broker's send path itself refuses it."""

    async def go() -> None:
        conn = await aio.connect(url_for(pb.url, "no"))
        try:
            s = await conn.create_session()
            futs = [s.create_producer("p.send.a").send_nowait(f"m{i}".encode()) for i in range(3)]
            for fut in futs:
                assert fut is not None
                with pytest.raises(tandem.Unauthorized, match=r"'send' on address 'p.send.a'"):
                    await fut
            assert (await conn.manage("broker.status"))["state"] == "active"
        finally:
            await conn.close()

    asyncio.run(go())


def test_most_specific_wins_with_nothing_inherited(broker_factory: Factory, tmp_path: Path) -> None:
    settings = (
        '[security-settings."orders.#"]\nsend = ["app"]\nconsume = ["app"]\n'
        '[security-settings."orders.eu.#"]\nconsume = ["app"]\n'  # no `send` here: denied, not inherited
    )
    decl = "".join(
        f'[[addresses]]\nname = "{n}"\n[[addresses.queues]]\nname = "{n}"\n' for n in ("orders.us", "orders.eu.de")
    )
    b = broker_factory(**secured(tmp_path, {"app": ["app"]}, ACCEPTORS + decl + settings)).start()
    with connect(b, "app") as conn, conn.session() as s:
        s.create_producer("orders.us").send(b"us")
        with pytest.raises(tandem.Unauthorized, match=r"'send' on address 'orders.eu.de'"):
            s.create_producer("orders.eu.de").send(b"eu")
        s.create_consumer("orders.eu.de")  # what the specific pattern grants still holds


def test_security_off_allows_everything(broker_factory: Factory) -> None:
    """security-settings are ignored without security-enabled (as before)."""
    b = broker_factory(extra_toml=ACCEPTORS + '[security-settings."#"]\nsend = ["nobody"]\n').start()
    with tandem.connect(b.url) as conn, conn.session() as s:
        s.create_producer("free").send(b"x")
        m = s.create_consumer("free").receive(timeout=5)
        assert m is not None and m.body == b"x"
        assert conn.manage("broker.status")["state"] == "active"


def test_the_cluster_user_has_no_application_permissions(broker_factory: Factory, tmp_path: Path) -> None:
    """It logs in (a backup announces itself with it) but may not send or manage, even on `#`
    granted to every role a user could have."""
    settings = '[security-settings."#"]\n' + "".join(f'{p} = ["app"]\n' for p in PERMISSIONS)
    b = broker_factory(**secured(tmp_path, {"app": ["app"]}, ACCEPTORS + settings)).start()
    from urllib.parse import quote

    from secured import CLUSTER_PASSWORD

    url = f"{b.url}?username=tandem.cluster&password={quote(CLUSTER_PASSWORD)}"
    with tandem.connect(url) as conn:
        with pytest.raises(tandem.Unauthorized):
            conn.manage("broker.stop")
        with conn.session() as s, pytest.raises(tandem.Unauthorized):
            s.create_producer("anything").send(b"x")
    assert b.running
    with connect(b, "app") as conn:
        assert conn.manage("broker.status")["state"] == "active"


# ------------------------------------------------------------------------------------- STOMP


class Listener(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.frames: list[tuple[str, Any]] = []

    def _add(self, kind: str, frame: Any) -> None:
        with self.cond:
            self.frames.append((kind, frame))
            self.cond.notify_all()

    def on_message(self, frame: Any) -> None:
        self._add("MESSAGE", frame)

    def on_receipt(self, frame: Any) -> None:
        self._add("RECEIPT", frame)

    def on_error(self, frame: Any) -> None:
        self._add("ERROR", frame)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def wait(self, kind: str, timeout: float = 5.0) -> Any:
        with self.cond:
            ok = self.cond.wait_for(lambda: any(k == kind for k, _ in self.frames), timeout)
            assert ok, f"no {kind}; got {[k for k, _ in self.frames]}"
            return next(f for k, f in self.frames if k == kind)


def stomp_client(b: BrokerProcess, user: str) -> tuple[stomp.Connection12, Listener]:
    conn = stomp.Connection12([("127.0.0.1", b.ports["stomp"])], auto_decode=False, reconnect_attempts_max=1)
    listener = Listener()
    conn.set_listener("l", listener)
    conn.connect(user, password_of(user), wait=True, headers={"client-id": f"{user}-client"})
    return conn, listener


def _stomp_op(conn: stomp.Connection12, perm: str) -> None:
    """Each with a receipt: the broker answers RECEIPT (allowed) or ERROR (denied)."""
    if perm == "send":
        conn.send("/queue/p.send.a", b"x", headers={"receipt": "r"})
    elif perm == "consume":
        conn.subscribe("/queue/p.consume.a", id="s1", headers={"receipt": "r"})
    elif perm == "create-durable-queue":  # a durable subscription makes its queue
        conn.subscribe(
            "/topic/p.create-durable-queue.a", id="s1", headers={"receipt": "r", "durable-subscription-name": "d"}
        )
    elif perm == "create-non-durable-queue":  # a plain topic subscription makes a temporary queue
        conn.subscribe("/topic/p.create-non-durable-queue.a", id="s1", headers={"receipt": "r"})
    elif perm == "create-address":  # a SEND to a missing topic address makes it
        conn.send("/topic/p.create-address.t", b"x", headers={"receipt": "r"})
    else:
        raise AssertionError(perm)


STOMP_SETTINGS = (
    '[security-settings."p.#"]\n'
    'consume = ["sub"]\n'  # subscriptions below consume; their queue creation is what is tested
    '[security-settings."p.send.#"]\nsend = ["yes"]\n'
    '[security-settings."p.consume.#"]\nconsume = ["yes"]\n'
    '[security-settings."p.create-durable-queue.#"]\nconsume = ["yes", "no"]\ncreate-durable-queue = ["yes"]\n'
    '[security-settings."p.create-non-durable-queue.#"]\nconsume = ["yes", "no"]\n'
    'create-non-durable-queue = ["yes"]\n'
    '[security-settings."p.create-address.#"]\nsend = ["yes", "no"]\ncreate-address = ["yes"]\n'
)
STOMP_DECL = (
    '[[addresses]]\nname = "p.send.a"\n[[addresses.queues]]\nname = "p.send.a"\n'
    '[[addresses]]\nname = "p.consume.a"\n[[addresses.queues]]\nname = "p.consume.a"\n'
    '[[addresses]]\nname = "p.create-durable-queue.a"\nrouting-type = "multicast"\n'
    '[[addresses]]\nname = "p.create-non-durable-queue.a"\nrouting-type = "multicast"\n'
)
STOMP_PERMISSIONS = ("send", "consume", "create-durable-queue", "create-non-durable-queue", "create-address")


@pytest.fixture(scope="module")
def sbk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("stomp-perms")
    b = BrokerProcess(tmp / "b", name="b", **secured(tmp, USERS, ACCEPTORS + STOMP_DECL + STOMP_SETTINGS))
    b.start()
    yield b
    b.kill()


@pytest.mark.parametrize("perm", STOMP_PERMISSIONS)
def test_each_permission_over_stomp(sbk: BrokerProcess, perm: str) -> None:
    """Denied: an ERROR frame (code UNAUTHORIZED) naming the permission and the address, and the
    connection closes, as STOMP 1.2 says an ERROR does. Allowed: the RECEIPT."""
    conn, listener = stomp_client(sbk, "no")
    try:
        _stomp_op(conn, perm)
        err = listener.wait("ERROR")
        text = err.headers.get("message", "")
        assert err.headers.get("code") == "UNAUTHORIZED", err.headers
        assert f"'{perm}'" in text and "p." in text and "'no'" in text, text
        assert err.headers.get("receipt-id") == "r", err.headers
    finally:
        conn.disconnect() if conn.is_connected() else None
    conn, listener = stomp_client(sbk, "yes")
    try:
        _stomp_op(conn, perm)
        listener.wait("RECEIPT")
        assert not [k for k, _ in listener.frames if k == "ERROR"]
    finally:
        conn.disconnect()


def test_stomp_unsubscribing_a_durable_subscription_needs_delete_durable_queue(
    broker_factory: Factory, tmp_path: Path
) -> None:
    settings = (
        '[security-settings."tandem.management"]\nview = ["owner"]\n'
        '[security-settings."news.#"]\nconsume = ["reader", "owner"]\n'
        'create-durable-queue = ["reader", "owner"]\ndelete-durable-queue = ["owner"]\n'
    )
    decl = '[[addresses]]\nname = "news"\nrouting-type = "multicast"\n'
    users = {"reader": ["reader"], "owner": ["owner"]}
    b = broker_factory(**secured(tmp_path, users, ACCEPTORS + decl + settings)).start()
    for user, allowed in (("reader", False), ("owner", True)):
        conn, listener = stomp_client(b, user)
        headers = {"durable-subscription-name": "daily"}
        conn.subscribe("/topic/news", id="s", headers={**headers, "receipt": "sub"})
        listener.wait("RECEIPT")
        conn.unsubscribe("s", headers={**headers, "receipt": "unsub"})
        if allowed:
            listener.wait_for(lambda: False, 0.3)  # (stomp.py's listener: its own thread)
            receipts = [f.headers.get("receipt-id") for k, f in listener.frames if k == "RECEIPT"]
            assert receipts == ["sub", "unsub"], receipts
            assert not [k for k, _ in listener.frames if k == "ERROR"]
            conn.disconnect()
        else:
            err = listener.wait("ERROR")
            assert "'delete-durable-queue' on address 'news'" in err.headers.get("message", ""), err.headers
    with tandem.connect(url_for(b.url, "owner")) as conn:
        names = {q["name"] for q in conn.manage("queue.stat")}
        assert "reader-client.daily" in names, names  # the refused UNSUBSCRIBE kept it
        assert "owner-client.daily" not in names, names  # deleted by the owner's UNSUBSCRIBE


def test_stomp_auto_creation_needs_the_create_permissions(broker_factory: Factory, tmp_path: Path) -> None:
    users = {"sender": ["sender"], "reader": ["reader"], "maker": ["maker"], "admin": ["admin"]}
    b = broker_factory(**secured(tmp_path, users, ACCEPTORS + AUTO)).start()
    for user, op, needed in (
        ("sender", lambda c: c.send("/queue/auto.orders", b"x", headers={"receipt": "r"}), "create-address"),
        ("reader", lambda c: c.subscribe("/queue/auto.jobs", id="s", headers={"receipt": "r"}), "create-durable-queue"),
    ):
        conn, listener = stomp_client(b, user)
        try:
            op(conn)
            err = listener.wait("ERROR")
            assert err.headers.get("code") == "UNAUTHORIZED", err.headers
            assert f"'{needed}' on address 'auto." in err.headers.get("message", ""), err.headers
        finally:
            conn.disconnect() if conn.is_connected() else None
    with tandem.connect(url_for(b.url, "admin")) as nconn:
        names = {a["name"] for a in nconn.manage("address.list")}
        assert not names & {"auto.orders", "auto.jobs"}, names  # nothing was made silently
    conn, listener = stomp_client(b, "maker")
    try:
        conn.subscribe("/queue/auto.jobs", id="s", headers={"receipt": "r1"})
        conn.send("/queue/auto.jobs", b"made", headers={"receipt": "r2"})
        msg = listener.wait("MESSAGE")
        assert msg.body == b"made"
        assert not [k for k, _ in listener.frames if k == "ERROR"]
    finally:
        conn.disconnect()
