"""The store pressure of a chaos run (`--store`, store.py): bodies that identify their value, a
large body damaged on the way read as a value never sent, the paging configuration the servers
load, and the consumers' pauses."""

from __future__ import annotations

from pathlib import Path

from tandem.chaos import checker
from tandem.chaos import store as stores
from tandem.chaos.topology import Pair
from tandem.chaos.workload import QUEUE
from tandem.config import load_config


def large_values(n: int) -> list[str]:
    return [v for v in (f"s0-{i}" for i in range(n)) if stores.is_large(v)]


def test_a_third_of_the_values_or_so_are_large_and_each_body_gives_its_value_back() -> None:
    vs = [f"t{k}-{i}-{j}" for k in range(2) for i in range(100) for j in range(5)]
    large = [v for v in vs if stores.is_large(v)]
    assert 0.25 < len(large) / len(vs) < 0.42
    for v in vs[:200]:
        body = stores.body_of("large", v)
        assert stores.value_of(body.encode()) == v
        if v in large:
            assert len(body) == stores.LARGE_BODY > stores.LARGE_THRESHOLD
        else:
            assert body == v
    assert all(stores.body_of(s, v) == v for s in ("plain", "paging") for v in large[:20])


def test_a_large_body_cut_doubled_or_shuffled_reads_as_a_value_never_sent() -> None:
    v = large_values(20)[0]
    body = stores.body_of("large", v).encode()
    step = stores.LARGE_THRESHOLD  # the chunk size
    damaged = [
        body[:-1],
        body[:step] + body[2 * step :],  # a chunk missing
        body[:step] + body[:step] + body[2 * step :],  # the first chunk twice
        body[step : 2 * step] + body[:step] + body[2 * step :],  # two chunks swapped
        body[:step] + bytes(step) + body[2 * step :],  # zeros instead of a chunk
    ]
    for b in damaged:  # read as "<what stands before the bar>|damaged": never sent
        got = stores.value_of(b)
        assert got.endswith("|damaged") and len(got) <= 48, got
    assert stores.value_of(damaged[0]) == f"{v}|damaged"
    assert stores.value_of(body[stores.LARGE_BODY // 2 :]).endswith("|damaged")  # no bar left
    # a small value's body carrying padding (it was never sent large) is damaged too
    small = next(x for x in (f"s1-{i}" for i in range(20)) if not stores.is_large(x))
    assert stores.value_of(stores.body_of("large", v).replace(v, small, 1).encode()) == f"{small}|damaged"
    events = [
        {"t": 0, "ev": "attempt", "p": "s0", "vs": [v]},
        {"t": 0, "ev": "ok", "p": "s0", "vs": [v]},
        {"t": 1, "ev": "deliver", "p": "a0", "vs": [stores.value_of(damaged[1])], "ack": "auto"},
    ]
    verdict = checker.check(events)
    assert not verdict["valid"] and verdict["unexpected"] == 1 and verdict["lost"] == 1


def test_the_paging_servers_load_a_tiny_page_limit_for_the_chaos_address(tmp_path: Path) -> None:
    pair = Pair(tmp_path / "pair", "shared-store", store="paging")
    config = load_config(pair.servers[0].config_path)
    chaos = config.address_settings[QUEUE]
    assert chaos.max_size_bytes == stores.MAX_SIZE_BYTES and chaos.page_size_bytes == stores.PAGE_SIZE_BYTES
    assert chaos.address_full_policy == "PAGE"
    plain = Pair(tmp_path / "plain", "shared-store")
    assert QUEUE not in load_config(plain.servers[0].config_path).address_settings


def test_a_paging_runs_consumers_pause_together_part_of_each_period_and_others_never() -> None:
    period, pause = stores.PAUSE_EVERY, stores.PAUSE_FOR
    assert stores.pause_left("paging", 0.0) == 0.0
    assert stores.pause_left("paging", period - pause - 0.01) == 0.0
    assert stores.pause_left("paging", period - pause) == pause
    assert abs(stores.pause_left("paging", 3 * period - 1.0) - 1.0) < 1e-9
    assert all(stores.pause_left(s, t / 10) == 0.0 for s in ("plain", "large") for t in range(200))
    assert stores.client_options("paging")["consumer_window_size"] == stores.CONSUMER_WINDOW
    assert stores.client_options("large")["min_large_message_size"] == stores.LARGE_THRESHOLD
    assert stores.client_options("plain") == {}


def test_paging_large_pages_and_streams_at_once(tmp_path: Path) -> None:
    v = large_values(20)[0]
    assert stores.body_of("paging-large", v) == stores.body_of("large", v) != v
    options = stores.client_options("paging-large")
    assert options == {"min_large_message_size": stores.LARGE_THRESHOLD, "consumer_window_size": stores.CONSUMER_WINDOW}
    assert stores.pause_left("paging-large", stores.PAUSE_EVERY - 1.0) > 0
    pair = Pair(tmp_path / "pair", "replication", store="paging-large")
    assert load_config(pair.servers[1].config_path).address_settings[QUEUE].address_full_policy == "PAGE"
