"""The HTTP management API over a real broker process: real HTTP on 127.0.0.1 (docs/management.md)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable

import pytest

from broker_process import BrokerProcess
from mgmt_http import Api, management_toml
from tandem.client.blocking import connect
from tandem.testing import free_port

Factory = Callable[..., BrokerProcess]


def test_overview_of_a_broker_with_messages(broker_factory: Factory) -> None:
    b = broker_factory(extra_toml=management_toml()).start()
    assert "management" in b.ports, b.banner
    api = Api.of(b)
    with connect(b.url) as conn:
        s = conn.session()
        p = s.create_producer("orders")
        for i in range(5):
            p.send(f"m{i}".encode())
    o = api.ok("GET", "/api/overview")
    assert o["name"] == "b"  # broker_factory names it
    assert o["state"] == "active"
    assert o["role"] == "live-only"
    assert o["messages"] == 5
    assert o["delivering"] == 0
    assert o["paged"] == 0
    assert o["queues"] >= 1
    assert o["connections"] == 0
    assert set(o["rates"]) == {"in", "out"}
    assert o["management"] == f"http://127.0.0.1:{b.ports['management']}"
    assert isinstance(o["version"], str) and o["node_id"]
    a = api.get("/api/overview")
    assert a.headers["content-type"].startswith("application/json")
    assert a.headers["server"] == "tandem" and a.headers["cache-control"] == "no-store"


def test_errors_are_json_with_a_code(broker_factory: Factory) -> None:
    b = broker_factory(extra_toml=management_toml()).start()
    api = Api.of(b)
    a = api.get("/api/nothing-here")
    assert a.status == 404 and a.code == "NOT_FOUND"
    a = api.request("DELETE", "/api/overview")
    assert a.status == 405 and a.code == "METHOD_NOT_ALLOWED"
    a = api.get("/api/overview?bogus=1")
    assert a.status == 400 and a.code == "INVALID_ARGUMENT"
    assert "bogus" in a.json["error"]["message"]


def test_the_listener_stops_with_the_broker(broker_factory: Factory) -> None:
    b = broker_factory(extra_toml=management_toml()).start()
    api = Api.of(b)
    assert api.ok("GET", "/api/overview")["state"] == "active"
    assert b.stop() == 0
    with pytest.raises(OSError):
        api.get("/api/overview")


def test_off_unless_configured(broker_factory: Factory) -> None:
    b = broker_factory().start()
    assert "management" not in b.ports


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tandem", "run", *args], capture_output=True, text=True, timeout=60)


def test_management_bind_option_and_the_loopback_rule(broker_factory: Factory) -> None:
    b = broker_factory()
    port = free_port()
    cmd = ["--config", str(b.config_path), "--management-bind", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem", "run", *cmd],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for _ in range(50):
            line = proc.stdout.readline()
            lines.append(line)
            if not line or line.startswith("Stop with Ctrl-C"):
                break
        assert any(f"management: 127.0.0.1:{port}" in line for line in lines), lines
        assert Api("127.0.0.1", port).ok("GET", "/api/overview")["state"] == "active"
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()
    # With security off a network address is refused (exit 2, naming the option), as for acceptors.
    r = _run("--config", str(b.config_path), "--management-bind", "0.0.0.0:0")
    assert r.returncode == 2, r.stderr
    assert "--management-bind" in r.stderr and "security-enabled" in r.stderr


def test_pages_of_other_sites_cannot_use_the_listener(broker_factory: Factory) -> None:
    """With security off nobody logs in, so what a browser would send for another site's page is
    refused: a change whose Origin is not the listener, and any request by a name that is not a
    loopback one (DNS rebinding: evil.example resolving to 127.0.0.1)."""
    b = broker_factory(extra_toml=management_toml()).start()
    api = Api.of(b)
    with connect(b.url) as conn:
        p = conn.session().create_producer("kept")
        for _ in range(3):
            p.send(b"x")
    here = f"127.0.0.1:{b.ports['management']}"
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": f"http://{here}.evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
    ):
        a = api.request("DELETE", "/api/queues/kept/messages", headers=headers)
        assert a.status == 403 and a.code == "UNAUTHORIZED", (headers, a.body)
    a = api.get("/api/overview", headers={"Host": f"evil.example:{b.ports['management']}"})
    assert a.status == 403 and "loopback" in a.json["error"]["message"]
    assert api.ok("GET", "/api/queues/kept")["message_count"] == 3  # nothing was purged
    # The listener's own pages (the console) and programs without an Origin are served.
    assert api.get("/api/overview", headers={"Host": f"localhost:{b.ports['management']}"}).status == 200
    a = api.request("DELETE", "/api/queues/kept/messages", headers={"Origin": f"http://{here}"})
    assert a.status == 200 and a.json == {"removed": 3}


def test_a_taken_port_stops_start_up_naming_the_listener(broker_factory: Factory) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        b = broker_factory(extra_toml=management_toml(f"127.0.0.1:{port}"))
        with pytest.raises(RuntimeError, match=r"exited with 1") as info:
            b.start()
    assert f"[management] cannot listen on 127.0.0.1:{port}" in str(info.value)
