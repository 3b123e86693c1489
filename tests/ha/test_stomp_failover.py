"""A STOMP client after a kill -9 failover of a shared-store or a replicated pair (real processes, stomp.py).

STOMP has no session reattachment: the client connects again, to the backup's STOMP acceptor,
and must find there every persistent message it had a receipt for, and its durable
subscription with the messages published to the topic while it was away.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import stomp

from ha_pair import Cluster
from replicated_pair import ReplicatedPair


class Inbox(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.messages: list[Any] = []
        self.receipts: set[str] = set()
        self.errors: list[Any] = []

    def on_message(self, frame: Any) -> None:
        with self.cond:
            self.messages.append(frame)
            self.cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(frame)
            self.cond.notify_all()

    def wait(self, predicate: Any, timeout: float = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)


def connect(port: int, client_id: str) -> tuple[stomp.Connection12, Inbox]:
    conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0), auto_content_length=True)
    inbox = Inbox()
    conn.set_listener("inbox", inbox)
    conn.connect(wait=True, headers={"client-id": client_id})
    return conn, inbox


@pytest.mark.parametrize("kind", ["shared-store", "replicated"])
def test_stomp_client_finds_durable_messages_and_subscription_on_the_backup(tmp_path: Path, kind: str) -> None:
    """With replication, a receipt means the backup has the message too: it is on the backup's own disk."""
    c = (
        Cluster(tmp_path, 1, stomp=True) if kind == "shared-store" else ReplicatedPair(tmp_path, stomp=True)
    ).start_all()
    try:
        conn, inbox = connect(c.stomp_ports[0], "ticker")
        conn.subscribe("/topic/prices", "p", ack="client-individual", **{"durable-subscription-name": "prices"})
        conn.unsubscribe("p")  # detach; the durable subscription stays
        n = 40
        for i in range(n):
            conn.send("/queue/work", f"work-{i}", headers={"persistent": "true", "receipt": f"w{i}"})
            conn.send("/topic/prices", f"price-{i}", headers={"persistent": "true", "receipt": f"p{i}"})
        conn.send("/queue/work", "transient", headers={"receipt": "t"})  # not persistent: may be lost
        want = {f"w{i}" for i in range(n)} | {f"p{i}" for i in range(n)} | {"t"}
        assert inbox.wait(lambda: want <= inbox.receipts), sorted(want - inbox.receipts)[:5]
        assert not inbox.errors

        c.primary.kill()  # kill -9: no goodbye to the client, nothing flushed
        c.wait_state(1, "active")
        try:
            conn.disconnect()
        except Exception:
            pass  # the socket died with the primary

        conn2, inbox2 = connect(c.stomp_ports[1], "ticker")
        try:
            conn2.subscribe("/queue/work", "w", ack="client-individual")
            conn2.subscribe("/topic/prices", "p", ack="client-individual", **{"durable-subscription-name": "prices"})
            bodies = lambda dest: [m.body for m in inbox2.messages if m.headers["destination"] == dest]  # noqa: E731
            assert inbox2.wait(lambda: len(bodies("/queue/work")) >= n and len(bodies("/topic/prices")) >= n)
            inbox2.wait(lambda: False, 0.5)  # anything extra (a duplicate) would arrive now
            work = [b for b in bodies("/queue/work") if b != "transient"]
            assert work == [f"work-{i}" for i in range(n)]
            assert bodies("/topic/prices") == [f"price-{i}" for i in range(n)]
            for m in list(inbox2.messages):
                conn2.ack(m.headers["ack"], receipt=f"a-{m.headers['ack']}")
            assert inbox2.wait(lambda: len(inbox2.receipts) == len(inbox2.messages))
            assert not inbox2.errors
        finally:
            conn2.disconnect()
    finally:
        c.kill_all()
