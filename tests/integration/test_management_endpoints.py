"""Each endpoint of the HTTP management API against real brokers: its JSON shape, its errors
(unknown queue -> 404 with a code, a bad argument -> 400), and the CLI that shares its op."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import stomp

from broker_process import BrokerProcess
from ha_pair import Cluster
from mgmt_http import Api, management_toml
from replicated_pair import ReplicatedPair
from tandem.client.blocking import connect
from tandem.errors import TandemError
from tandem.testing import FaultProxy, free_port

Factory = Callable[..., BrokerProcess]
BOTH = (
    '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
    '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
)
WAIT = 10.0  # s: bounded waits for what the broker does in the background


def start(broker_factory: Factory, **kw: Any) -> tuple[BrokerProcess, Api]:
    b = broker_factory(extra_toml=BOTH + management_toml(), **kw).start()
    return b, Api.of(b)


def send(url: str, address: str, n: int, **fields: Any) -> None:
    with connect(url) as conn:
        p = conn.session().create_producer(address)
        for i in range(n):
            p.send(f"{address}-{i}".encode(), **fields)


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tandem", *map(str, args)], capture_output=True, text=True, timeout=60)


def until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {WAIT}s: {what}")


def test_addresses(broker_factory: Factory) -> None:
    b, api = start(broker_factory)
    with connect(b.url) as conn:
        s = conn.session()
        s.create_queue("prices.eu", address="prices", routing_type="multicast")
        s.create_queue("orders")
    rows = {a["name"]: a for a in api.ok("GET", "/api/addresses")}
    assert rows["prices"]["routing_types"] == ["multicast"] and rows["prices"]["queues"] == ["prices.eu"]
    assert rows["orders"]["queues"] == ["orders"]


def test_queue_list_pages_searches_and_sorts(broker_factory: Factory) -> None:
    b, api = start(broker_factory)
    with connect(b.url) as conn:
        s = conn.session()
        for i in range(25):
            s.create_queue(f"q-{i:02d}")
        s.create_queue("other")
    send(b.url, "q-07", 3)
    send(b.url, "q-03", 5)
    page = api.ok("GET", "/api/queues?name=q-&page=2&page_size=10")
    assert page["total"] == 25 and page["page"] == 2 and page["page_size"] == 10
    assert [q["name"] for q in page["items"]] == [f"q-{i:02d}" for i in range(10, 20)]
    item = page["items"][0]
    assert {"message_count", "delivering_count", "paged_count", "consumer_count", "rates"} <= set(item)
    assert set(item["rates"]) == {"added", "acked"}
    last = api.ok("GET", "/api/queues?name=q-&page=3&page_size=10")
    assert [q["name"] for q in last["items"]] == [f"q-{i:02d}" for i in range(20, 25)]
    assert api.ok("GET", "/api/queues?name=q-&page=4&page_size=10")["items"] == []
    top = api.ok("GET", "/api/queues?sort=-message_count&page_size=2")
    assert [(q["name"], q["message_count"]) for q in top["items"]] == [("q-03", 5), ("q-07", 3)]
    assert top["total"] == 26
    assert api.ok("GET", "/api/queues?sort=-name&page_size=1")["items"][0]["name"] == "q-24"
    assert api.ok("GET", "/api/queues?name=nothing-like-it")["total"] == 0
    for bad in ("page=0", "page_size=0", "page_size=1001", "page=x", "sort=colour", "page=1&page=2", "nme=q"):
        a = api.get(f"/api/queues?{bad}")
        assert a.status == 400 and a.code == "INVALID_ARGUMENT", (bad, a.body)


def test_rates_count_what_was_sent_and_acknowledged(broker_factory: Factory) -> None:
    b, api = start(broker_factory)
    with connect(b.url) as conn:
        conn.session().create_queue("rated")
    api.ok("GET", "/api/queues/rated")  # a first sample, before the sends
    send(b.url, "rated", 40)
    rates = until(lambda: (r := api.ok("GET", "/api/queues/rated")["rates"])["added"] and r, "a rate for the sends")
    # 40 messages between two samples at least a second apart: at most 40 msg/s.
    assert 0 < rates["added"] <= 40 and rates["acked"] == 0
    assert until(lambda: api.ok("GET", "/api/overview")["rates"]["in"], "a broker-wide rate in")
    with connect(b.url) as conn:
        c = conn.session().create_consumer("rated")
        for _ in range(40):
            assert c.receive(WAIT) is not None
    assert until(lambda: api.ok("GET", "/api/queues/rated")["rates"]["acked"], "a rate of acknowledgements")
    assert until(lambda: api.ok("GET", "/api/overview")["rates"]["out"], "a broker-wide rate out")


def test_queue_detail_has_settings_in_force_and_consumers(broker_factory: Factory) -> None:
    b, api = start(
        broker_factory,
        address_settings={"orders.#": {"max-delivery-attempts": 3, "dead-letter-address": "DLQ"}},
    )
    send(b.url, "orders.eu", 2)
    with connect(b.url) as conn:
        c = conn.session().create_consumer("orders.eu", filter="colour = 'red'")
        q = api.ok("GET", "/api/queues/orders.eu")
        assert q["name"] == "orders.eu" and q["message_count"] == 2
        assert q["settings"]["max-delivery-attempts"] == 3
        assert q["settings"]["dead-letter-address"] == "DLQ"
        assert q["settings"]["address-full-policy"] == "PAGE"  # a default, in force all the same
        assert q["settings"]["default-queue-routing-type"] == "anycast"
        [consumer] = q["consumers"]
        assert consumer["queue"] == "orders.eu" and consumer["selector"] == "colour = 'red'"
        assert consumer["delivering"] == 0 and consumer["since"] <= time.time()
        [conn_row] = [r for r in api.ok("GET", "/api/connections") if r["consumers"] == 1]
        assert consumer["connection"] == conn_row["id"]
        c.close()
    a = api.get("/api/queues/nope")
    assert a.status == 404 and a.code == "QUEUE_DOES_NOT_EXIST"
    a = api.get("/api/queues/orders.eu?detail=false")
    assert a.status == 400 and a.code == "INVALID_ARGUMENT"


def test_purge(broker_factory: Factory) -> None:
    b, api = start(broker_factory)
    send(b.url, "work", 7)
    assert api.ok("DELETE", "/api/queues/work/messages") == {"removed": 7}
    assert api.ok("GET", "/api/queues/work")["message_count"] == 0
    assert api.ok("DELETE", "/api/queues/work/messages") == {"removed": 0}
    a = api.request("DELETE", "/api/queues/nope/messages")
    assert a.status == 404 and a.code == "QUEUE_DOES_NOT_EXIST"


def test_queue_operations(broker_factory: Factory) -> None:
    """Browse (query values converted to the op's types), move by selector, pause and resume,
    retry: the routes of docs/management.md "Queue operations"."""
    b, api = start(broker_factory)
    with connect(b.url) as conn:
        conn.session().create_queue("elsewhere")
        p = conn.session().create_producer("work")
        for i in range(5):
            p.send(f"message {i}".encode(), properties={"n": i, "kind": "odd" if i % 2 else "even"})
    rows = api.ok("GET", "/api/queues/work/messages?count=2&preview=7")
    assert [r["body_preview"] for r in rows] == ["message", "message"] and rows[0]["headers"]["n"] == 0
    odd = api.ok("GET", "/api/queues/work/messages?" + "selector=" + quote("kind = 'odd'"))
    assert [r["headers"]["n"] for r in odd] == [1, 3]
    bad = api.request("GET", "/api/queues/work/messages?count=many")
    assert bad.status == 400 and bad.code == "INVALID_ARGUMENT"
    assert api.ok("POST", "/api/queues/work/move", {"to": "elsewhere", "selector": "kind = 'odd'"}) == {
        "moved": 2,
        "left": 0,
    }
    assert api.ok("GET", "/api/queues/elsewhere")["message_count"] == 2
    assert api.ok("POST", "/api/queues/work/move", {"to": "elsewhere", "copy": True, "limit": 1})["copied"] == 1
    assert api.ok("GET", "/api/queues/work")["message_count"] == 3
    assert api.ok("POST", "/api/queues/work/pause") == {"name": "work", "paused": True}
    assert api.ok("GET", "/api/queues/work")["paused"] is True
    assert api.ok("POST", "/api/queues/work/resume") == {"name": "work", "paused": False}
    assert api.ok("POST", "/api/queues/work/retry", {})["retried"] == 0  # no dead letters: nothing has an origin
    missing = api.request("POST", "/api/queues/nope/pause")
    assert missing.status == 404 and missing.code == "QUEUE_DOES_NOT_EXIST"


def test_connections_consumers_and_closing_one(broker_factory: Factory) -> None:
    b, api = start(broker_factory)
    st = stomp.Connection12([("127.0.0.1", b.ports["stomp"])])
    st.connect(wait=True)
    try:
        with connect(b.url) as conn:
            s = conn.session()
            s.create_queue("watched")
            s.create_consumer("watched")
            rows = {r["protocol"]: r for r in api.ok("GET", "/api/connections")}
            assert set(rows) == {"native", "stomp"}
            native = rows["native"]
            assert native["peer"].startswith("127.0.0.1:") and native["tls"] is False and native["user"] is None
            assert native["sessions"] >= 1 and native["consumers"] == 1
            assert abs(native["since"] - time.time()) < 60
            assert rows["stomp"]["version"] == "1.2"
            consumers = api.ok("GET", "/api/consumers")
            assert [(c["queue"], c["connection"]) for c in consumers] == [("watched", native["id"])]
            # The CLI runs the same op: same ids.
            r = cli("connection", "list", "--json", "--url", b.url)
            assert r.returncode == 0, r.stderr
            listed = {c["id"] for c in json.loads(r.stdout)}
            assert {native["id"], rows["stomp"]["id"]} <= listed  # (and the CLI's own connection)
            r = cli("connection", "list", "--url", b.url)
            assert r.returncode == 0 and "PEER" in r.stdout and native["peer"] in r.stdout, r.stdout
            # Closed by HTTP: the client learns it at its next call.
            assert api.ok("DELETE", f"/api/connections/{native['id']}") == {"closed": native["id"]}
            until(lambda: native["id"] not in {c["id"] for c in api.ok("GET", "/api/connections")}, "closed")
            with pytest.raises(TandemError):
                s.create_queue("after-close")
        # Closed by the CLI.
        r = cli("connection", "close", rows["stomp"]["id"], "--url", b.url)
        assert r.returncode == 0 and f"closed connection {rows['stomp']['id']}" in r.stdout, r.stderr
        until(lambda: not st.is_connected(), "the STOMP client sees its connection closed")
    finally:
        if st.is_connected():
            st.disconnect()
    assert api.ok("GET", "/api/consumers") == []
    a = api.request("DELETE", "/api/connections/999999")
    assert a.status == 404 and a.code == "CONNECTION_DOES_NOT_EXIST"
    a = api.request("DELETE", "/api/connections/abc")
    assert a.status == 400 and a.code == "INVALID_ARGUMENT"
    r = cli("connection", "close", "999999", "--url", b.url)
    assert r.returncode == 1 and "CONNECTION_DOES_NOT_EXIST" in r.stderr


def test_journal(broker_factory: Factory) -> None:
    b, api = start(broker_factory)
    send(b.url, "kept", 10)
    j = api.ok("GET", "/api/journal")
    assert j["persistence"] is True and j["data_directory"] == str(b.data_dir)
    data = j["journals"]["tandem-data"]
    assert set(j["journals"]) == {"tandem-data", "tandem-bindings"}
    assert data["files"] and all(f["name"].endswith(".tj") and f["size"] > 0 for f in data["files"])
    assert data["bytes"] == sum(f["size"] for f in data["files"])
    assert data["live_records"] >= 10 and data["live_records"] == sum(f["live_records"] for f in data["files"])
    assert data["compactions"] == 0 and data["last_compaction"] is None
    m = broker_factory("mem", extra_toml=BOTH + management_toml(), persistence_enabled=False).start()
    assert Api.of(m).ok("GET", "/api/journal") == {"persistence": False, "journals": {}}


PAGED = {"paged.#": {"max-size-bytes": 32 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 8 * 1024}}
LARGE = 16 * 1024  # the client's min_large_message_size here


def on_disk(directory: Path, suffix: str) -> dict[str, int]:
    """The files of a store directory ending in `suffix`, with their sizes."""
    return {p.name: p.stat().st_size for p in directory.iterdir() if p.name.endswith(suffix)}


def test_journal_lists_page_files_and_large_messages(broker_factory: Factory) -> None:
    b, api = start(broker_factory, address_settings=PAGED)
    with connect(b.url) as conn:
        conn.session().create_queue("plain")
    quiet = api.ok("GET", "/api/journal")
    assert quiet["paging"] == {
        "directory": str(b.data_dir / "paging"),
        "file_count": 0,
        "bytes": 0,
        "addresses": [],
    }
    assert quiet["large_messages"]["file_count"] == 0 and quiet["large_messages"]["bytes"] == 0
    assert quiet["large_messages"]["directory"] == str(b.data_dir / "large-messages")

    send(b.url, "paged.q", 300, properties={"pad": "x" * 1000})
    bodies = [bytes([i]) * (100_000 + i) for i in range(3)]
    with connect(f"{b.url}?min_large_message_size={LARGE}") as conn:
        p = conn.session().create_producer("big")
        for data in bodies:
            p.send(data)

    stat = api.ok("GET", "/api/queues/paged.q")
    assert stat["message_count"] == 300 and stat["paged_count"] > 100, stat
    pages = on_disk(b.data_dir / "paging", ".page")
    assert len(pages) > 3, pages
    j = api.ok("GET", "/api/journal?max_files=3")
    paging = j["paging"]
    assert (paging["file_count"], paging["bytes"]) == (len(pages), sum(pages.values()))
    (store,) = paging["addresses"]
    numbers = sorted(int(n.split("-")[1].split(".")[0]) for n in pages)
    assert store["address"] == "paged.q" and store["paging"] is True
    assert (store["file_count"], store["bytes"]) == (len(pages), sum(pages.values()))
    assert (store["first_page"], store["last_page"]) == (numbers[0], numbers[-1])
    assert store["paged_messages"] == stat["paged_count"]
    assert store["messages"] >= stat["paged_count"]
    assert store["truncated"] is True and len(store["files"]) == 3
    for f in store["files"]:
        assert f["size"] == pages[f["name"]] and f["name"].endswith(f"-{f['page']:010d}.page")
    assert [f["page"] for f in store["files"]] == numbers[:3]
    large = j["large_messages"]
    msgs = on_disk(b.data_dir / "large-messages", ".msg")
    assert len(msgs) == 3 and sorted(msgs.values()) == [len(d) for d in bodies]
    assert (large["file_count"], large["bytes"]) == (3, sum(len(d) for d in bodies))
    assert large["messages"] == 3 and large["truncated"] is False
    assert {f["name"]: f["size"] for f in large["files"]} == msgs
    whole = api.ok("GET", "/api/journal")["paging"]["addresses"][0]
    assert whole["truncated"] is False and len(whole["files"]) == len(pages)
    assert api.request("GET", "/api/journal?max_files=-1").code == "INVALID_ARGUMENT"

    with connect(f"{b.url}?min_large_message_size={LARGE}") as conn:
        s = conn.session()
        big = s.create_consumer("big")
        got = [big.receive(5) for _ in bodies]
        assert [m.body if m is not None else None for m in got] == bodies
        c = s.create_consumer("paged.q")
        texts = []
        for _ in range(300):
            m = c.receive(5)
            assert m is not None, f"only {len(texts)} of 300 received"
            texts.append(m.text)
        assert texts == [f"paged.q-{i}" for i in range(300)]

    def drained() -> dict[str, Any] | None:
        j = api.ok("GET", "/api/journal")
        empty = j["paging"]["file_count"] == 0 and j["large_messages"]["file_count"] == 0
        return j if empty else None

    j = until(drained, "the page files and large message files removed once acknowledged")
    assert on_disk(b.data_dir / "paging", ".page") == {} and on_disk(b.data_dir / "large-messages", ".msg") == {}
    assert j["paging"]["bytes"] == 0 and j["large_messages"]["bytes"] == 0 and j["large_messages"]["messages"] == 0
    (store,) = j["paging"]["addresses"]
    assert (store["file_count"], store["bytes"], store["paged_messages"], store["files"]) == (0, 0, 0, [])
    assert store["first_page"] is None and store["last_page"] is None and store["paging"] is False


def test_ha_of_a_single_broker(broker_factory: Factory) -> None:
    b, api = start(broker_factory)
    ha = api.ok("GET", "/api/ha")
    assert ha["role"] == "live-only" and ha["state"] == "active" and ha["active"] is True
    assert ha["members"] == [{"node_id": ha["node_id"], "live": f"127.0.0.1:{b.port}", "backup": None}]
    assert ha["activated_at"] <= time.time()
    assert ha["activation"]["coordinator"] == "none"


def k_none(api: Api) -> bool:
    """A passive backup has taken nothing over yet."""
    h = api.ok("GET", "/api/ha")
    return h["last_failover"] is None and h["activated_at"] is None


def test_ha_of_a_shared_store_pair_across_a_kill(tmp_path: Path) -> None:
    pair = Cluster(tmp_path)
    for server in pair.servers:  # each with its own listener
        with server.config_path.open("a") as f:
            f.write(management_toml())
    try:
        pair.start_all()
        primary, backup = Api.of(pair.primary), Api.of(pair.backup)
        p = primary.ok("GET", "/api/ha")
        assert p["role"] == "primary" and p["active"] is True and p["state"] == "active"
        assert p["last_failover"] is None and k_none(backup)
        assert p["members"][0]["backup"] == f"127.0.0.1:{pair.ports[1]}"
        k = backup.ok("GET", "/api/ha")
        assert k["role"] == "backup" and k["active"] is False and k["state"] == "passive"
        assert k["node_id"] == p["node_id"]
        assert backup.ok("GET", "/api/overview")["state"] == "passive"
        a = backup.get("/api/queues")  # a waiting backup has no queues to show
        assert a.status == 503 and a.code == "NOT_ACTIVE"
        pair.primary.kill()
        took = until(lambda: (h := backup.ok("GET", "/api/ha"))["active"] and h, "the backup takes over")
        assert took["state"] == "active" and took["activated_at"] <= time.time()
        assert took["last_failover"] == took["activated_at"]
        assert backup.ok("GET", "/api/queues")["total"] >= 0
    finally:
        pair.kill_all()


def test_queue_names_with_reserved_characters_are_percent_encoded(broker_factory: Factory) -> None:
    b, api = start(broker_factory)
    names = ["orders/eu", "a b", "wild.#", "q?x=1", "ünï"]
    for name in names:
        send(b.url, name, 1)
    for name in names:
        path = "/api/queues/" + quote(name, safe="")
        assert api.ok("GET", path)["name"] == name, name
        assert api.ok("DELETE", path + "/messages") == {"removed": 1}, name
    assert api.ok("GET", "/api/queues?name=" + quote("a b"))["items"][0]["name"] == "a b"


def test_ha_of_a_replicated_pair_shows_replication_and_its_lag(tmp_path: Path) -> None:
    pair = ReplicatedPair(tmp_path)
    for server in pair.servers:
        with server.config_path.open("a") as f:
            f.write(management_toml())
    try:
        pair.start_all()
        primary, backup = Api.of(pair.primary), Api.of(pair.backup)
        send(pair.url_of(0), "replicated", 20)
        p = until(lambda: (h := primary.ok("GET", "/api/ha"))["replication_lag"]["records"] == 0 and h, "caught up")
        assert p["role"] == "primary" and p["replication"] == "in-sync"
        assert p["replication_peer"] == f"127.0.0.1:{pair.ports[1]}"
        assert p["replication_lag"]["oldest_unacknowledged_s"] >= 0
        assert p["members"][0]["backup"] == f"127.0.0.1:{pair.ports[1]}"
        assert primary.ok("GET", "/api/overview")["replication_lag"] == p["replication_lag"]
        k = backup.ok("GET", "/api/ha")
        assert k["role"] == "backup" and k["state"] == "passive" and k["replication"] == "in-sync"
        assert k["node_id"] == p["node_id"]
        links = [c for c in primary.ok("GET", "/api/connections") if c["replica"]]
        assert len(links) == 1 and links[0]["protocol"] == "native"
    finally:
        pair.kill_all()


def test_closing_a_detached_connection_drops_the_sessions_it_kept(broker_factory: Factory) -> None:
    """A connection whose socket died keeps its sessions for a reattach until its TTL: listed as
    `detached`, and closing it lets them go at once."""
    port = free_port()
    b = broker_factory(
        connection_check_period=100,
        connector_ref="via-proxy",
        extra_toml=f'[[connectors]]\nname = "via-proxy"\nurl = "127.0.0.1:{port}"\n' + BOTH + management_toml(),
    ).start()
    api = Api.of(b)
    with FaultProxy(b.port, port=port) as proxy:
        conn = connect(proxy.url, connection_ttl=60_000, confirmation_window_size=1024, reconnect_attempts=0)
        try:
            conn.session().create_queue("kept-for-reattach")
            proxy.refuse_new()
            proxy.reset()
            [row] = until(lambda: [r for r in api.ok("GET", "/api/connections") if r["detached"]], "detached")
            assert row["sessions"] == 1
            assert api.ok("DELETE", f"/api/connections/{row['id']}") == {"closed": row["id"]}
            until(lambda: api.ok("GET", "/api/connections") == [], "the detached connection gone")
            assert api.ok("GET", "/api/overview")["detached_connections"] == 0
        finally:
            conn.close()
