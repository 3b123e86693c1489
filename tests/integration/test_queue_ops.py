"""Queue operations (browse, move, copy, retry, pause, resume) over real broker processes,
through the `tandem queue` CLI and the client's MANAGE op (docs/management.md, "Queue operations")."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tandem
import tandem.aio as aio
from broker_process import BrokerProcess
from client_io import queue_stat
from secured import secured, url_for

CLI_TIMEOUT = 60.0
# Small limits so a few thousand messages page.
PAGED = {"paged.#": {"max-size-bytes": 512 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 128 * 1024}}
SMALL = {"small.#": {"max-size-bytes": 64 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 32 * 1024}}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def cli(*args: object, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_URL"}
    return subprocess.run(
        [sys.executable, "-m", "tandem", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env
    )


def ok(*args: object) -> str:
    r = cli(*args)
    assert r.returncode == 0 and "Traceback" not in r.stderr, f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def fails(*args: object) -> str:
    r = cli(*args)
    assert r.returncode != 0 and "Traceback" not in r.stderr and r.stderr.strip(), f"{args}:\n{r.stdout}\n{r.stderr}"
    return r.stderr


async def send(url: str, address: str, bodies: list[str], props: list[dict[str, Any]] | None = None) -> None:
    conn = await aio.connect(url)
    try:
        prod = (await conn.create_session()).create_producer(address)
        for i, body in enumerate(bodies):
            await prod.send_async(tandem.Message(body, properties=props[i] if props else None))
        await prod.flush()
    finally:
        await conn.close()


async def manage(url: str, op: str, **args: Any) -> Any:
    conn = await aio.connect(url)
    try:
        return await conn.manage(op, **args)
    finally:
        await conn.close()


async def drain(url: str, queue: str, wait: float = 1.0, limit: int = 1_000_000) -> list[tandem.Message]:
    conn = await aio.connect(url)
    out: list[Any] = []
    try:
        consumer = await (await conn.create_session()).create_consumer(queue)
        while len(out) < limit and (m := await consumer.receive(wait)) is not None:
            out.append(m)
        await consumer.close()
    finally:
        await conn.close()
    return out


def serials(messages: list[Any]) -> list[int]:
    return [int(m.properties["n"]) for m in messages]


# -------------------------------------------------------------------- browse
def test_browse_shows_memory_and_pages_with_selector_preview_and_large_bodies(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=SMALL).start()
    n = 1200
    colours = ["red" if i % 3 else "blue" for i in range(n)]
    run(
        send(
            b.url,
            "small.b",
            [f"m{i:05d}-" + "é" * 100 for i in range(n)],
            [{"n": i, "colour": c} for i, c in enumerate(colours)],
        )
    )
    before = run(queue_stat(b.url, "small.b"))
    assert before["paged_count"] > n // 2  # most of it paged

    rows = run(manage(b.url, "queue.browse", name="small.b", count=5000, preview=10))
    assert len(rows) == 1000  # capped
    assert [r["headers"]["n"] for r in rows] == list(range(1000))
    assert [r["seq"] for r in rows] == sorted(r["seq"] for r in rows)
    assert any(r["paged"] for r in rows) and not rows[0]["paged"]
    first = rows[0]
    assert first["body_preview"] == "m00000-é" and first["body_encoding"] == "utf-8"  # 10 bytes: a cut é left out
    assert first["body_size"] == len(("m00000-" + "é" * 100).encode())
    assert (first["durable"], first["large"], first["delivery_count"], first["address"]) == (True, False, 0, "small.b")

    blue = run(manage(b.url, "queue.browse", name="small.b", count=1000, selector="colour = 'blue'", preview=0))
    assert [r["headers"]["n"] for r in blue] == [i for i in range(n) if colours[i] == "blue"]
    assert all(r["body_preview"] == "" for r in blue)
    after = run(queue_stat(b.url, "small.b"))
    assert (after["message_count"], after["paged_count"], after["delivering_count"]) == (
        n,
        before["paged_count"],
        0,
    )  # browsing moved nothing

    # Large messages: the size is the file's, the preview a bounded read (inflated when compressed).
    big = ("0123456789" * 30_000).encode()  # 300 kB
    for compress in (False, True):

        async def send_large(compress: bool = compress) -> None:
            conn = await aio.connect(
                b.url + f"?min_large_message_size=1024&compress_large_messages={str(compress).lower()}"
            )
            try:
                prod = (await conn.create_session()).create_producer("large.q")
                await prod.send(tandem.Message(big, properties={"compressed": compress}))
            finally:
                await conn.close()

        run(send_large())
    rows = run(manage(b.url, "queue.browse", name="large.q", preview=20))
    assert [r["large"] for r in rows] == [True, True]
    assert rows[0]["body_size"] == len(big) and rows[0]["body_preview"] == "01234567890123456789"
    assert rows[1]["compressed"] is True and rows[1]["body_size"] < len(big)
    assert rows[1]["body_preview"] == "01234567890123456789"

    out = ok("queue", "browse", "--url", b.url, "small.b", "--count", 3, "--selector", "colour = 'blue'")
    assert out.count("seq ") == 3 and "colour: blue" in out and "(3 messages)" in out
    as_json = json.loads(ok("queue", "browse", "--url", b.url, "small.b", "--count", 1001, "--json", "--preview", 1))
    assert len(as_json) == 1000 and as_json[-1]["paged"] is True

    # Bad arguments: errors that name the field.
    assert "`count`" in fails("queue", "browse", "--url", b.url, "small.b", "--count", -1)
    assert "`preview`" in fails("queue", "browse", "--url", b.url, "small.b", "--preview", 10**6)
    assert "`selector`" in fails("queue", "browse", "--url", b.url, "small.b", "--selector", "colour ==")
    assert "does not exist" in fails("queue", "browse", "--url", b.url, "nope")
    with pytest.raises(tandem.InvalidArgument, match="unknown argument `colour`"):
        run(manage(b.url, "queue.browse", name="small.b", colour="red"))


# ---------------------------------------------------------------------- move
@pytest.mark.parametrize("colour", ["red", "blue"])  # 90 % of the messages, 10 %
def test_move_by_selector_through_pages_then_kill_loses_and_doubles_nothing(broker_factory: Any, colour: str) -> None:
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    n = 10_000
    colours = ["blue" if i % 10 == 0 else "red" for i in range(n)]
    chosen = [i for i in range(n) if colours[i] == colour]
    run(
        send(
            b.url,
            "paged.src",
            [f"m{i:05d}" + "x" * 100 for i in range(n)],
            [{"n": i, "colour": colours[i]} for i in range(n)],
        )
    )
    ok("queue", "create", "--url", b.url, "paged.dst")
    paged = run(queue_stat(b.url, "paged.src"))["paged_count"]
    assert paged > n // 2
    # Killed once some paged ones moved too (each acknowledged alone in its page), if not done by then.
    past_memory = sum(1 for i in chosen if i < n - paged) + 100
    selector = f"colour = '{colour}'"
    move = [sys.executable, "-m", "tandem", "queue", "move", "--url", b.url, "paged.src", "--to", "paged.dst"]
    mover = subprocess.Popen([*move, "--selector", selector], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and mover.poll() is None:
        if run(queue_stat(b.url, "paged.dst"))["message_count"] >= past_memory:
            break
    b.kill()  # kill -9 in the middle of the move, or just after it
    mover.communicate(timeout=60)
    b.start()
    src = run(queue_stat(b.url, "paged.src"))
    dst = run(queue_stat(b.url, "paged.dst"))
    assert src["message_count"] + dst["message_count"] == n  # each message in exactly one of the two
    assert 0 < dst["message_count"] <= len(chosen)

    out = ok("queue", "move", "--url", b.url, "paged.src", "--to", "paged.dst", "--selector", selector)
    assert "messages from 'paged.src' to 'paged.dst'" in out and "stayed" not in out, out
    src = run(queue_stat(b.url, "paged.src"))
    assert src["message_count"] == n - len(chosen)
    assert src["memory_bytes"] <= 512 * 1024 and src["paged_count"] > 0  # what stays was not read into memory
    assert b.stop() == 0  # `tandem data print` counts what a restart finds, moved paged records left out
    printed = ok("data", "print", b.data_dir).split("== messages per queue")[1].split()
    assert printed[printed.index("paged.src") + 1] == str(n - len(chosen))
    assert printed[printed.index("paged.dst") + 1] == str(len(chosen))
    b.start()
    got_src = serials(run(drain(b.url, "paged.src")))
    got_dst = run(drain(b.url, "paged.dst"))
    assert got_src == sorted(set(range(n)) - set(chosen))
    assert serials(got_dst) == chosen  # in order, none twice, none lost
    m = got_dst[0]
    assert m.properties["_AMQ_ORIG_ADDRESS"] == "paged.src" and m.properties["_AMQ_ORIG_QUEUE"] == "paged.src"
    assert m.text.startswith(f"m{chosen[0]:05d}")


def test_move_a_whole_paged_queue_and_copy_with_a_limit(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(address_settings=PAGED).start()
    n = 6000
    run(send(b.url, "paged.a", [f"m{i:05d}" + "y" * 150 for i in range(n)], [{"n": i} for i in range(n)]))
    ok("queue", "create", "--url", b.url, "copies")
    out = ok("queue", "move", "--url", b.url, "paged.a", "--to", "copies", "--copy", "--limit", 7)
    assert "copied 7 messages from 'paged.a' to 'copies'" in out
    assert run(queue_stat(b.url, "paged.a"))["message_count"] == n  # copies leave the originals
    assert run(queue_stat(b.url, "copies"))["message_count"] == 7

    res = run(manage(b.url, "queue.move", name="paged.a", to="paged.b"))  # auto-creates paged.b
    assert res == {"moved": n, "left": 0}
    assert run(queue_stat(b.url, "paged.a"))["message_count"] == 0
    assert serials(run(drain(b.url, "paged.b"))) == list(range(n))
    assert serials(run(drain(b.url, "copies"))) == list(range(7))

    assert "`to`" in fails("queue", "move", "--url", b.url, "paged.a", "--to", "")
    assert "`limit`" in fails("queue", "move", "--url", b.url, "paged.a", "--to", "x", "--limit", -2)
    assert "already" in fails("queue", "move", "--url", b.url, "paged.a", "--to", "paged.a")
    r = cli("queue", "move", "--url", b.url, "paged.a")
    assert r.returncode == 2 and "--to" in r.stderr  # argparse names the missing option


def test_messages_in_delivery_stay(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory().start()
    run(send(b.url, "held", [f"m{i}" for i in range(5)], [{"n": i} for i in range(5)]))

    async def main() -> None:
        conn = await aio.connect(b.url)
        try:
            consumer = await (await conn.create_session(ack_mode="client")).create_consumer("held")
            first = await consumer.receive(5)
            assert first is not None and first.properties["n"] == 0
            deadline = time.monotonic() + 10
            while (await queue_stat(b.url, "held"))["delivering_count"] != 5 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # the other four are in the client's buffer: in delivery too
            res = await manage(b.url, "queue.move", name="held", to="elsewhere")
            assert res["moved"] == 0
        finally:
            await conn.close()  # unacknowledged: back in the queue

    run(main())
    assert serials(run(drain(b.url, "held"))) == list(range(5))


# --------------------------------------------------------------------- retry
def test_retry_sends_dead_letters_back_to_their_queue(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(
        address_settings={"#": {"max-delivery-attempts": 2, "dead-letter-address": "DLQ"}}
    ).start()
    run(send(b.url, "orders", [f"o{i}" for i in range(3)], [{"n": i, "k": "a" if i < 2 else "b"} for i in range(3)]))
    ok("queue", "create", "--url", b.url, "audit", "--address", "orders", "--routing-type", "multicast")

    async def fail_twice() -> None:
        for _ in range(2):
            conn = await aio.connect(b.url)
            consumer = await (await conn.create_session(ack_mode="client")).create_consumer("orders")
            got = [await consumer.receive(5) for _ in range(3)]
            assert all(m is not None for m in got)
            await consumer.close()  # handed over, not acknowledged: failed deliveries
            await conn.close()

    run(fail_twice())
    # The copies join the DLQ it auto-created once its record is stored, a moment after the close.
    deadline = time.monotonic() + 5
    while run(queue_stat(b.url, "DLQ"))["message_count"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run(queue_stat(b.url, "DLQ"))["message_count"] == 3
    browsed = run(manage(b.url, "queue.browse", name="DLQ"))
    assert [r["headers"]["_AMQ_ORIG_ADDRESS"] for r in browsed] == ["orders"] * 3

    out = ok("queue", "retry", "--url", b.url, "DLQ", "--selector", "k = 'a'")
    assert "retried 2 messages from 'DLQ'" in out
    assert run(queue_stat(b.url, "DLQ"))["message_count"] == 1
    assert run(manage(b.url, "queue.retry", name="DLQ")) == {"retried": 1, "left": 0}
    back = run(drain(b.url, "orders"))
    assert sorted(serials(back)) == [0, 1, 2] and [m.text for m in back][:2] == ["o0", "o1"]
    assert all("_AMQ_ORIG_ADDRESS" not in m.properties for m in back)
    assert all(m.delivery_count == 1 for m in back)  # a fresh copy: its failed deliveries are over
    # Only the original queue gets them back, not every queue of the address (as Artemis's retryMessages).
    assert run(queue_stat(b.url, "audit"))["message_count"] == 0


# --------------------------------------------------------------- pause/resume
def test_pause_survives_restart_and_kill_and_resume_delivers(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory().start()
    ok("queue", "create", "--url", b.url, "jobs")
    assert "queue 'jobs' is paused" in ok("queue", "pause", "--url", b.url, "jobs")
    run(send(b.url, "jobs", [f"j{i}" for i in range(5)], [{"n": i} for i in range(5)]))
    stat = run(queue_stat(b.url, "jobs"))
    assert (stat["paused"], stat["message_count"], stat["messages_added"]) == (True, 5, 5)  # still receives
    assert run(drain(b.url, "jobs", wait=0.5)) == []  # delivers nothing
    rows = run(manage(b.url, "queue.browse", name="jobs"))
    assert len(rows) == 5  # browsing still works

    assert b.stop() == 0
    b.start()
    assert run(queue_stat(b.url, "jobs"))["paused"] is True
    assert run(drain(b.url, "jobs", wait=0.5)) == []
    b.kill()
    b.start()
    assert run(queue_stat(b.url, "jobs"))["paused"] is True

    assert "queue 'jobs' is delivering" in ok("queue", "resume", "--url", b.url, "jobs")
    assert serials(run(drain(b.url, "jobs"))) == list(range(5))
    b.stop()
    b.start()
    assert run(queue_stat(b.url, "jobs"))["paused"] is False
    assert "does not exist" in fails("queue", "pause", "--url", b.url, "nope")


# ------------------------------------------------------------------ security
def test_view_may_browse_but_not_move_pause_or_retry(broker_factory: Any, tmp_path: Path) -> None:
    users = {"admin": ["admin"], "watcher": ["monitor"], "editor": ["ops"]}
    settings = (
        '[security-settings."#"]\n'
        'send = ["admin"]\nconsume = ["admin"]\ncreate-address = ["admin"]\ncreate-durable-queue = ["admin"]\n'
        'manage = ["admin"]\nview = ["monitor"]\nedit = ["ops"]\n'
    )
    b: BrokerProcess = broker_factory(**secured(tmp_path, users, settings)).start()
    admin, watcher, editor = (url_for(b.url, u) for u in ("admin", "watcher", "editor"))
    run(send(admin, "s.q", ["a", "b"], [{"n": 0}, {"n": 1}]))
    ok("queue", "create", "--url", admin, "s.other")

    assert "(2 messages)" in ok("queue", "browse", "--url", watcher, "s.q")
    for args in (
        ("move", "s.q", "--to", "s.other"),
        ("retry", "s.q"),
        ("pause", "s.q"),
        ("resume", "s.q"),
    ):
        err = fails("queue", *args[:1], "--url", watcher, *args[1:])
        assert "UNAUTHORIZED" in err and "'manage' or 'edit'" in err, err
    assert run(queue_stat(admin, "s.q"))["message_count"] == 2

    assert "moved 1 messages" in ok("queue", "move", "--url", editor, "s.q", "--to", "s.other", "--limit", 1)
    assert "is paused" in ok("queue", "pause", "--url", editor, "s.q")
    counts = Counter({q: run(queue_stat(admin, q))["message_count"] for q in ("s.q", "s.other")})
    assert counts == Counter({"s.q": 1, "s.other": 1})
