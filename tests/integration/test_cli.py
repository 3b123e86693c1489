"""The `tandem` command end to end: `python -m tandem ...` subprocesses against real broker processes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tandem
from broker_process import BrokerProcess
from tandem.testing import free_port

Factory = Callable[..., BrokerProcess]
CLI_TIMEOUT = 60.0


def tandem_cli(
    *args: object, timeout: float = CLI_TIMEOUT, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_URL"}
    return subprocess.run(
        [sys.executable, "-m", "tandem", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )


def _show(r: subprocess.CompletedProcess[str]) -> str:
    return f"{r.args[3:]} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"


def ok(*args: object, timeout: float = CLI_TIMEOUT) -> str:
    r = tandem_cli(*args, timeout=timeout)
    assert r.returncode == 0, _show(r)
    assert "Traceback" not in r.stderr, _show(r)
    return r.stdout


def fails(
    *args: object, timeout: float = CLI_TIMEOUT, cwd: Path | None = None, quiet: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run a command that must fail with a message on stderr (unless `quiet`), not a traceback."""
    r = tandem_cli(*args, timeout=timeout, cwd=cwd)
    assert r.returncode != 0, _show(r)
    assert quiet or r.stderr.strip(), _show(r)
    assert "Traceback" not in r.stderr, _show(r)
    return r


def _close_pipe(b: BrokerProcess) -> None:
    """BrokerProcess leaves the child's stdout pipe open; close it once the child is gone (no ResourceWarning)."""
    if b.proc is not None and b.proc.poll() is not None and b.proc.stdout is not None:
        b.proc.stdout.close()


@pytest.fixture
def brokers(broker_factory: Factory) -> Iterator[Factory]:
    made: list[BrokerProcess] = []

    def make(**settings: Any) -> BrokerProcess:
        b = broker_factory(**settings)
        made.append(b)
        return b

    yield make
    for b in made:
        b.kill()
        _close_pipe(b)


@pytest.fixture
def running(brokers: Factory) -> BrokerProcess:
    return brokers().start()


def queue_stat(url: str, name: str) -> dict[str, Any]:
    rows = json.loads(ok("queue", "stat", "--url", url, name, "--json"))
    assert [r["name"] for r in rows] == [name]
    return rows[0]  # type: ignore[no-any-return]


def parse_table(text: str) -> dict[str, dict[str, str]]:
    """The CLI's column table → {first column: {HEADER: cell}} (cells never contain spaces here)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = lines[0].split()
    rows = {}
    for ln in lines[1:]:
        cells = ln.split()
        rows[cells[0]] = dict(zip(header, cells, strict=False))
    return rows


# ------------------------------------------------------------------ basics
def test_version() -> None:
    out = ok("--version")
    assert out.strip() == f"tandem {tandem.__version__}"


def test_producer_and_consumer(running: BrokerProcess) -> None:
    url = running.url
    out = ok("producer", "--url", url, "--destination", "q", "--count", 500, "--size", 256)
    assert re.search(r"\bsent 500, confirmed 500\b", out), out
    assert queue_stat(url, "q")["message_count"] == 500

    out = ok("consumer", "--url", url, "--destination", "q", "--count", 500, "--timeout", 10)
    assert re.search(r"\breceived 500 of 500\b", out), out
    stat = queue_stat(url, "q")
    assert (stat["message_count"], stat["messages_acknowledged"]) == (0, 500)

    r = fails("consumer", "--url", url, "--destination", "q", "--count", 10, "--timeout", 1, quiet=True)
    assert "received 0 of 10" in r.stdout

    # fewer than asked for: still non-zero, but what did arrive is printed, counted and acknowledged
    ok("producer", "--url", url, "--destination", "q", "--count", 3, "--size", 40)
    r = fails("consumer", "--url", url, "--destination", "q", "--count", 10, "--timeout", 1, "--print", quiet=True)
    lines = r.stdout.splitlines()
    assert lines[-1] == "received 3 of 10 from 'q'"
    assert [len(x) for x in lines[:-1]] == [40, 40, 40]
    assert queue_stat(url, "q")["message_count"] == 0


def test_commands_without_a_broker_fail_cleanly() -> None:
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    for args in (
        ("producer", "--url", url, "--destination", "q", "--count", 1),
        ("consumer", "--url", url, "--destination", "q", "--count", 1, "--timeout", 1),
        ("queue", "stat", "--url", url),
        ("admin", "status", "--url", url),
    ):
        r = fails(*args, timeout=30)
        assert r.returncode == 1, _show(r)
        assert "cannot connect" in r.stderr and f"127.0.0.1:{port}" in r.stderr, _show(r)


# ---------------------------------------------------------- administration
def test_queue_administration(running: BrokerProcess) -> None:
    url = running.url
    assert "created queue 'orders'" in ok("queue", "create", "--url", url, "orders")
    r = fails("queue", "create", "--url", url, "orders")
    assert r.returncode == 1 and "'orders'" in r.stderr and "already exists" in r.stderr, _show(r)

    table = parse_table(ok("queue", "stat", "--url", url))
    assert table["orders"]["MESSAGE_COUNT"] == "0"
    assert table["orders"]["ROUTING_TYPE"] == "anycast"

    ok("producer", "--url", url, "--destination", "orders", "--count", 7, "--size", 16)
    stat = queue_stat(url, "orders")
    assert (stat["message_count"], stat["messages_added"], stat["durable"]) == (7, 7, True)
    table = parse_table(ok("queue", "stat", "--url", url))
    assert table["orders"]["MESSAGE_COUNT"] == "7"
    assert table["orders"]["PAUSED"] == "False"
    assert "queue 'orders' is paused" in ok("queue", "pause", "--url", url, "orders")
    assert parse_table(ok("queue", "stat", "--url", url))["orders"]["PAUSED"] == "True"
    assert parse_table(ok("queue", "stat", "--url", url, "orders"))["orders"]["PAUSED"] == "True"
    assert "queue 'orders' is delivering" in ok("queue", "resume", "--url", url, "orders")
    assert parse_table(ok("queue", "stat", "--url", url))["orders"]["PAUSED"] == "False"

    assert "purged 7 messages from 'orders'" in ok("queue", "purge", "--url", url, "orders")
    assert queue_stat(url, "orders")["message_count"] == 0

    assert "deleted queue 'orders'" in ok("queue", "delete", "--url", url, "orders")
    assert "orders" not in {q["name"] for q in json.loads(ok("queue", "stat", "--url", url, "--json"))}
    r = fails("queue", "stat", "--url", url, "orders")
    assert "'orders'" in r.stderr

    r = fails("queue", "delete", "--url", url, "no-such-queue")
    assert r.returncode == 1, _show(r)
    assert "'no-such-queue'" in r.stderr and "does not exist" in r.stderr, _show(r)


def test_queue_create_reader_only_refuses_consumers(running: BrokerProcess) -> None:
    url = running.url
    ok("queue", "create", "--url", url, "spark.in", "--reader-only")
    assert queue_stat(url, "spark.in")["reader_only"] is True
    ok("producer", "--url", url, "--destination", "spark.in", "--count", 3, "--size", 8)
    r = fails("consumer", "--url", url, "--destination", "spark.in", "--count", 1, "--timeout", 5)
    assert "reader-only" in r.stderr, _show(r)
    assert queue_stat(url, "spark.in")["message_count"] == 3


def test_address_administration(running: BrokerProcess) -> None:
    url = running.url

    def addresses() -> dict[str, dict[str, Any]]:
        return {a["name"]: a for a in json.loads(ok("address", "list", "--url", url, "--json"))}

    assert "created address 'events'" in ok("address", "create", "--url", url, "events")
    ok("address", "create", "--url", url, "topics", "--routing-type", "multicast")
    listed = addresses()
    assert listed["events"]["routing_types"] == "anycast"
    assert listed["events"]["auto_created"] is False
    assert listed["topics"]["routing_types"] == "multicast"
    assert "events" in parse_table(ok("address", "list", "--url", url))
    r = fails("address", "create", "--url", url, "events")
    assert "'events'" in r.stderr and "already exists" in r.stderr, _show(r)

    ok("queue", "create", "--url", url, "ev1", "--address", "events")
    assert addresses()["events"]["queues"] == "ev1"
    r = fails("address", "delete", "--url", url, "events")
    assert "ev1" in r.stderr, _show(r)
    assert "deleted address 'events'" in ok("address", "delete", "--url", url, "events", "--force")
    assert "events" not in addresses()
    assert "ev1" not in {q["name"] for q in json.loads(ok("queue", "stat", "--url", url, "--json"))}
    r = fails("address", "delete", "--url", url, "events")
    assert r.returncode == 1 and "'events'" in r.stderr, _show(r)


def test_admin_status(running: BrokerProcess) -> None:
    node = re.search(r"\(node ([^,)\s]+)", running.banner)
    assert node is not None, running.banner
    status = json.loads(ok("admin", "status", "--url", running.url, "--json"))
    assert status["name"] == "b"
    assert status["node_id"] == node.group(1)
    assert isinstance(status["uptime_s"], (int, float)) and status["uptime_s"] >= 0
    assert isinstance(status["role"], str) and status["role"]
    text = ok("admin", "status", "--url", running.url)
    assert re.search(rf"^node_id\s+{re.escape(node.group(1))}$", text, re.M), text


# --------------------------------------------------------------- tandem run
BAD_CONFIGS = [
    ("unknown key", "bogus-key = 1\n", ["bogus-key"]),
    ("ill-typed value", 'max-frame-size = "big"\n', ["max-frame-size"]),
    ("out of range", "max-frame-size = 10\n", ["max-frame-size"]),
    ("ill-typed enum", 'log-level = "chatty"\n', ["log-level"]),
    ("unknown nested key", '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\nport = 5\n', ["port"]),
    ("ill-typed nested value", "[[acceptors]]\nbind = 5\n", ["bind"]),
    ("bad bind in file", '[[acceptors]]\nbind = "nowhere"\n', ["bind", "nowhere"]),
    ("not TOML", "name = \n", []),
]


@pytest.mark.parametrize(("text", "names"), [(t, n) for _, t, n in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_run_rejects_bad_config(tmp_path: Path, text: str, names: list[str]) -> None:
    conf = tmp_path / "bad.toml"
    head = f'data-directory = "{tmp_path / "data"}"\n'
    tail = "" if "[[acceptors]]" in text else '[[acceptors]]\nbind = "127.0.0.1:0"\n'
    conf.write_text(head + text + tail)
    r = fails("run", "--config", conf, timeout=20, cwd=tmp_path)
    assert r.returncode == 2, _show(r)
    assert str(conf) in r.stderr, _show(r)
    for name in names:
        assert name in r.stderr, _show(r)


def test_run_rejects_bad_command_line(tmp_path: Path) -> None:
    r = fails("run", "--config", tmp_path / "missing.toml", timeout=20, cwd=tmp_path)
    assert r.returncode == 2 and str(tmp_path / "missing.toml") in r.stderr, _show(r)
    for bind in ("notaport", "127.0.0.1:99999"):
        r = fails("run", "--bind", bind, "--data", tmp_path / "data", timeout=20, cwd=tmp_path)
        assert r.returncode == 2, _show(r)
        assert "--bind" in r.stderr and bind in r.stderr, _show(r)


def test_run_stomp_bind_adds_a_stomp_acceptor(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem", "run", "--bind", "127.0.0.1:0", "--stomp-bind", "127.0.0.1:0",
         "--data", str(tmp_path / "data")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ports: dict[str, int] = {}
        for _ in range(40):
            line = proc.stdout.readline()
            if not line or line.startswith("Stop with Ctrl-C"):
                break
            m = re.search(r"listening\s+(\S+): 127\.0\.0\.1:(\d+)", line)
            if m:
                ports[m.group(1)] = int(m.group(2))
        assert set(ports) == {"native", "stomp"}, ports
        with socket.create_connection(("127.0.0.1", ports["stomp"]), timeout=5) as s:
            s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\0")
            assert s.recv(4096).startswith(b"CONNECTED\n")
        _round_trip(f"tcp://127.0.0.1:{ports['native']}", "next-to-stomp", 3)
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    r = fails("run", "--stomp-bind", "nowhere", "--data", tmp_path / "data2", timeout=20, cwd=tmp_path)
    assert r.returncode == 2 and "--stomp-bind" in r.stderr and "nowhere" in r.stderr, _show(r)


def _round_trip(url: str, queue: str, n: int) -> None:
    assert f"confirmed {n}" in ok("producer", "--url", url, "--destination", queue, "--count", n, "--size", 32)
    assert f"received {n} of {n}" in ok("consumer", "--url", url, "--destination", queue, "--count", n)


def test_second_broker_on_the_same_data_directory(running: BrokerProcess) -> None:
    r = fails("run", "--config", running.config_path, timeout=20)
    assert "in use" in r.stderr and str(running.data_dir) in r.stderr, _show(r)
    assert running.running
    _round_trip(running.url, "still-serving", 5)
    status = json.loads(ok("admin", "status", "--url", running.url, "--json"))
    assert status["node_id"] in running.banner


def test_port_already_in_use(running: BrokerProcess, tmp_path: Path) -> None:
    """A second broker (own data directory) on a port that is taken: a clear message, no traceback."""
    r = fails("run", "--bind", f"127.0.0.1:{running.port}", "--data", tmp_path / "other", timeout=20)
    assert str(running.port) in r.stderr, _show(r)
    assert running.running
    _round_trip(running.url, "still-serving", 5)


# -------------------------------------------------------------- tandem data
def _send(url: str, queue: str, bodies: list[bytes]) -> None:
    with tandem.connect(url) as conn:
        prod = conn.session().create_producer(queue)
        for body in bodies:
            prod.send_async(body)
        prod.flush()


def _consume(url: str, queue: str, n: int, extra_wait: float = 0.0) -> list[bytes]:
    """Receive `n` messages (fewer if the queue runs dry), then look `extra_wait` s for one too many; ack durably."""
    got: list[bytes] = []
    with tandem.connect(url) as conn:
        cons = conn.session(ack_mode="client").create_consumer(queue)
        last = None
        for i in range(n + (1 if extra_wait else 0)):
            msg = cons.receive(timeout=5.0 if i < n else extra_wait)
            if msg is None:
                break
            got.append(msg.body)
            last = msg
        if last is not None:
            last.ack()
        cons.close()
    return got


def _per_queue(print_out: str) -> dict[str, int]:
    section = print_out.split("== messages per queue", 1)[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s+(\S+)\s+(\d+)$", section, re.M)}


def _journal_section(print_out: str, label: str) -> str:
    m = re.search(rf"^== {label} journal .*?(?=^== )", print_out, re.M | re.S)
    assert m is not None, print_out
    return m.group(0)


def test_data_print_and_compact(brokers: Factory) -> None:
    b = brokers().start()
    alpha = [f"alpha-{i:05d}-".encode() + b"a" * 600 for i in range(1500)]
    beta = [f"beta-{i:05d}-".encode() + b"b" * 600 for i in range(400)]
    _send(b.url, "alpha", alpha)
    _send(b.url, "beta", beta)
    assert _consume(b.url, "alpha", 900) == alpha[:900]
    left = {"alpha": alpha[900:], "beta": beta}

    r = fails("data", "compact", b.data_dir)
    assert "running" in r.stderr and str(b.data_dir) in r.stderr, _show(r)
    assert b.running
    assert queue_stat(b.url, "alpha")["message_count"] == 600

    assert b.stop() == 0
    _close_pipe(b)

    out = ok("data", "print", b.data_dir)
    assert _per_queue(out) == {"alpha": 600, "beta": 400}
    msgs = _journal_section(out, "messages")
    per_file = r"^\s+(\S+\.tj)\s+size (\d+)\s+used (\d+)\s+records (\d+)\s+live (\d+)\s+live bytes (\d+)$"
    listed = re.findall(per_file, msgs, re.M)
    assert len(listed) >= 2, msgs  # 1.2 MB of messages in 1 MiB journal files
    for name, *_ in listed:
        assert (b.data_dir / "journal" / name).is_file(), name
    head = re.search(r"files (\d+) \(\+\d+ free\), records (\d+), live (\d+)", msgs)
    assert head is not None, msgs
    assert int(head.group(1)) == len(listed)
    assert int(head.group(2)) == sum(int(x[3]) for x in listed)
    live_bytes = re.search(r"live bytes (\d+) of (\d+)$", msgs, re.M)
    assert live_bytes is not None, msgs
    assert int(live_bytes.group(1)) == sum(int(x[5]) for x in listed)
    assert 0 < int(live_bytes.group(1)) < int(live_bytes.group(2))  # 900 of 1900 messages acknowledged
    assert re.search(r"^\s+ADD MESSAGE\s+1900$", msgs, re.M), msgs
    assert re.search(r"^\s+DELETE\s+900$", msgs, re.M), msgs
    assert "bindings" in _journal_section(out, "bindings")

    out = ok("data", "compact", b.data_dir)
    assert "bindings:" in out and "messages:" in out

    out = ok("data", "print", b.data_dir)
    assert _per_queue(out) == {"alpha": 600, "beta": 400}
    msgs = _journal_section(out, "messages")
    assert re.search(r"^\s+ADD MESSAGE\s+1000$", msgs, re.M), msgs
    assert not re.search(r"^\s+DELETE\s", msgs, re.M), msgs

    b.start()
    assert "(1000 messages reloaded)" in b.banner
    for q, bodies in left.items():
        assert _consume(b.url, q, len(bodies), extra_wait=0.3) == bodies, q
        assert queue_stat(b.url, q)["message_count"] == 0

    # the compacted journal takes new writes that survive a kill -9
    more = [f"more-{i}".encode() for i in range(50)]
    _send(b.url, "alpha", more)
    b.kill()
    _close_pipe(b)
    b.start()
    assert _consume(b.url, "alpha", len(more), extra_wait=0.3) == more


def test_data_commands_on_a_non_data_directory(tmp_path: Path) -> None:
    for action in ("print", "compact"):
        r = fails("data", action, tmp_path)
        assert str(tmp_path) in r.stderr, _show(r)


# -------------------------------------------------------------- tandem perf
def test_perf_pair(running: BrokerProcess) -> None:
    out = ok(
        "perf", "pair", "--url", running.url, "--count", 2000, "--json", "--no-progress", "--timeout", 60, timeout=120
    )
    result = json.loads(out.strip().splitlines()[-1])
    assert "error" not in result, result
    assert result["count"] == 2000 and result["received"] == 2000
    assert result["msgs_per_s"] > 0
    lat = result["latency_ms"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["p999"], lat
    confirm = result["confirm_latency_ms"]  # send -> confirmation
    assert 0 < confirm["p50"] <= confirm["p99"] <= confirm["p999"], confirm


def test_perf_plain_sends_carry_no_dedup_ids_and_dedup_sends_do(running: BrokerProcess) -> None:
    """The plain figure must be plain durable sends (the client's default auto_dedup would add ids)."""
    args = ["--count", 300, "--json", "--no-progress", "--timeout", 60]
    ok("perf", "pair", "--url", running.url, *args, timeout=120)
    running.stop()
    assert "DUPLICATE_ID" not in ok("data", "print", running.data_dir)
    running.start()  # on a new port
    ok("perf", "pair", "--url", running.url, *args, "--dedup", timeout=120)
    running.stop()
    assert "DUPLICATE_ID" in ok("data", "print", running.data_dir)


def test_perf_producer_then_consumer_each_report_a_rate(running: BrokerProcess) -> None:
    common = ["--url", running.url, "--queue", "perf.split", "--count", 1500, "--json", "--no-progress"]
    produced = json.loads(ok("perf", "producer", *common, timeout=120).strip().splitlines()[-1])
    assert produced["msgs_per_s"] > 0 and "error" not in produced, produced
    consumed = json.loads(ok("perf", "consumer", *common, timeout=120).strip().splitlines()[-1])
    assert consumed["received"] == 1500 and "error" not in consumed, consumed
    assert consumed["msgs_per_s"] > 0 and consumed["duration_s"] > 0, consumed


def test_perf_consumer_verify_counts_every_message_number_once(running: BrokerProcess) -> None:
    """`--verify` (bench/paging.py's check) passes a complete run and names what a doubled run lacks."""
    common = ["--url", running.url, "--queue", "perf.verify", "--json", "--no-progress", "--timeout", 60]
    ok("perf", "producer", *common, "--count", 700, "--producers", 3, timeout=120)
    whole = json.loads(ok("perf", "consumer", *common, "--count", 700, "--verify", timeout=120).splitlines()[-1])
    assert whole["numbers"] == {"distinct": 700, "missing": 0, "duplicates": 0, "strays": 0, "first_missing": []}
    for _ in range(2):  # numbers 0..299 twice: a consumer of 600 sees 300 duplicates and misses 300..599
        ok("perf", "producer", *common, "--count", 300, timeout=120)
    r = tandem_cli("perf", "consumer", *common, "--count", 600, "--verify", timeout=120)
    assert r.returncode == 1, _show(r)
    doubled = json.loads(r.stdout.splitlines()[-1])
    assert doubled["numbers"]["duplicates"] == 300 and doubled["numbers"]["missing"] == 300, doubled
    assert doubled["numbers"]["first_missing"][:3] == [300, 301, 302] and "error" in doubled, doubled
