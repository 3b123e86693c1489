"""Review of issue 17 as a whole: ways around a permission check, against real broker processes.

Each test here shows one defect found in review (it fails until fixed). Users come from
tests/secured.py; the security-settings give the user `app` everything on `#` and the user
`nobody` only `view` on the management address (so it can log in and nothing else).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import tandem
from broker_process import BrokerProcess
from secured import secured, url_for

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
