"""Full addresses against real broker processes: the DROP policy, and the broker-wide limits
(`global-max-size`, `global-max-messages`) that BLOCK and FAIL honour across addresses."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import tandem


def _address(conn: Any, name: str) -> dict[str, Any]:
    rows = [a for a in conn.manage("address.list") if a["name"] == name]
    assert rows, f"no address {name!r}"
    return rows[0]  # type: ignore[no-any-return]


def _receive_all(conn: Any, queue: str, wait: float = 1.0) -> list[str]:
    consumer = conn.session().create_consumer(queue)
    out = []
    for _ in range(10_000):
        m = consumer.receive(wait)
        if m is None:
            break
        out.append(m.text)
    consumer.close()
    return out


def test_drop_policy_drops_counts_and_logs(broker_factory: Any) -> None:
    b = broker_factory(address_settings={"droppy": {"max-size-bytes": 5000, "address-full-policy": "DROP"}}).start()
    with tandem.connect(b.url) as conn:
        prod = conn.session().create_producer("droppy")
        for i in range(20):
            prod.send(f"{i:04d}" + "x" * 996)  # no error: the full address drops
        row = _address(conn, "droppy")
        kept = _receive_all(conn, "droppy")
        assert 4 <= len(kept) <= 6
        assert kept == [f"{i:04d}" + "x" * 996 for i in range(len(kept))]  # the first ones, in order
        assert row["messages_dropped"] == 20 - len(kept)
        prod.send("room again")
        assert _receive_all(conn, "droppy") == ["room again"]
    assert b.log_text().count("dropping messages") == 1  # one line per episode, not per message


def test_global_max_size_fails_sends_to_any_fail_address(broker_factory: Any) -> None:
    b = broker_factory(global_max_size=8000, address_settings={"#": {"address-full-policy": "FAIL"}}).start()
    with tandem.connect(b.url) as conn:
        s = conn.session()
        sent = {"a": 0, "b": 0}
        with pytest.raises(tandem.AddressFull):
            for _ in range(20):
                for name in ("a", "b"):  # neither address has a limit of its own
                    s.create_producer(name).send("y" * 1000)
                    sent[name] += 1
        assert 3 <= sent["a"] <= 5 and 3 <= sent["b"] <= 5
        assert len(_receive_all(conn, "a")) == sent["a"]
        s.create_producer("b").send("fits again")  # what a's consumer took made room for b


def test_global_max_messages_blocks_until_consumed(broker_factory: Any) -> None:
    b = broker_factory(global_max_messages=10, address_settings={"#": {"address-full-policy": "BLOCK"}}).start()
    with tandem.connect(b.url) as conn:
        conn.session().create_producer("other").send("one of the ten")
    progress = {"sent": 0}
    failed: list[BaseException] = []

    def produce() -> None:
        try:
            with tandem.connect(b.url, producer_window_size=8) as conn:
                prod = conn.session().create_producer("blocky")
                for i in range(30):
                    prod.send(f"m{i}")
                    progress["sent"] += 1
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=produce)
    t.start()
    time.sleep(1.5)
    assert progress["sent"] < 30, "the producer should be blocked by the broker's message limit"
    got: list[str] = []
    with tandem.connect(b.url) as conn:
        consumer = conn.session().create_consumer("blocky")
        for _ in range(60):
            m = consumer.receive(10)
            if m is None:
                break
            got.append(m.text)
            if len(got) == 30:
                break
    t.join(20)
    assert not failed, failed
    assert got == [f"m{i}" for i in range(30)]
