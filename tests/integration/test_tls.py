"""TLS on the acceptors against real broker processes: native and STOMP, wrong CAs refused on either
side, mutual TLS logging in through `cert-user-mapping`, the handshake deadline, certificate reload.

Certificates come from `tandem certs dev` (tandem.certs), made once per session.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import stomp

import tandem
from broker_process import BrokerProcess
from tandem.certs import DevCerts, write_dev_certs
from users import users_path, write_users

Factory = Callable[..., BrokerProcess]


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return write_dev_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def other(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    """Another CA with certificates of the same names: trusted by nobody here."""
    return write_dev_certs(tmp_path_factory.mktemp("other-certs"), ca_cn="Some other CA")


def acceptor(c: DevCerts, name: str = "native", protocol: str = "native", **more: Any) -> str:
    lines = [
        "[[acceptors]]",
        f'name = "{name}"',
        f'protocol = "{protocol}"',
        'bind = "127.0.0.1:0"',
        "ssl-enabled = true",
        f'cert-path = "{c.server}"',
        f'key-path = "{c.server_key}"',
    ]
    for k, v in more.items():
        key = k.replace("_", "-")
        lines.append(f"{key} = {'true' if v is True else 'false' if v is False else repr(v).replace(chr(39), chr(34))}")
    return "\n".join(lines) + "\n"


def tls_url(b: BrokerProcess, ca: Path, **opts: Any) -> str:
    query = "&".join([f"ca={quote(str(ca))}", *(f"{k}={quote(str(v))}" for k, v in opts.items())])
    return f"tcps://127.0.0.1:{b.port}?{query}"


def roundtrip(url: str, queue: str = "tls.q") -> None:
    with tandem.connect(url) as conn, conn.session() as s:
        s.create_producer(queue).send("over tls")
        got = s.create_consumer(queue).receive(10)
        assert got is not None and got.body == b"over tls"


def refused(url: str) -> str:
    with pytest.raises(tandem.TandemError) as info:
        tandem.connect(url, connect_timeout=3000).close()
    return str(info.value)


def test_native_client_over_tls(broker_factory: Factory, certs: DevCerts, other: DevCerts) -> None:
    b = broker_factory(extra_toml=acceptor(certs)).start()
    assert "tcps://127.0.0.1:" in b.banner  # the banner's example commands speak TLS too
    roundtrip(tls_url(b, certs.ca))
    # A client that trusts another CA refuses the server; one that speaks plain text gets nowhere.
    assert "CERTIFICATE_VERIFY_FAILED" in refused(tls_url(b, other.ca))
    refused(f"tcp://127.0.0.1:{b.port}")
    # ssl=true on a tcp:// URL is the same as tcps://.
    roundtrip(f"tcp://127.0.0.1:{b.port}?ssl=true&ca={quote(str(certs.ca))}")
    assert b.running


def test_hostname_is_verified_unless_turned_off(broker_factory: Factory, tmp_path: Path) -> None:
    """A certificate for `localhost` only: dialing 127.0.0.1 is refused unless verify_host=false."""
    c = write_dev_certs(tmp_path / "named", server_names=("localhost",))
    b = broker_factory(extra_toml=acceptor(c)).start()
    why = refused(tls_url(b, c.ca))
    assert "CERTIFICATE_VERIFY_FAILED" in why and "mismatch" in why, why
    roundtrip(tls_url(b, c.ca, verify_host="false"))


def test_stomp_py_over_tls(broker_factory: Factory, certs: DevCerts, other: DevCerts) -> None:
    b = broker_factory(extra_toml=acceptor(certs) + acceptor(certs, "stomp", "stomp")).start()
    port = b.ports["stomp"]
    got: list[Any] = []
    arrived = threading.Event()

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            got.append(frame)
            arrived.set()

    conn = stomp.Connection12([("127.0.0.1", port)], timeout=5)
    conn.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=str(certs.ca))
    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    try:
        conn.subscribe("/queue/tls.stomp", id="1", ack="auto")
        conn.send("/queue/tls.stomp", "stomp over tls")
        assert arrived.wait(10)
        assert got[0].body == "stomp over tls"
    finally:
        conn.disconnect()
    # The native client reads what a STOMP client sent over TLS, and the other way round.
    with tandem.connect(tls_url(b, certs.ca)) as nc, nc.session() as s:
        s.create_producer("tls.stomp2").send("from native")
    bad = stomp.Connection12([("127.0.0.1", port)], timeout=5)
    bad.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=str(other.ca))
    with pytest.raises(Exception):  # noqa: B017  stomp.py raises ssl errors or ConnectFailedException
        bad.connect(wait=True)
    assert b.running


def test_need_client_auth_refuses_clients_without_a_trusted_certificate(
    broker_factory: Factory, certs: DevCerts, other: DevCerts
) -> None:
    tls = acceptor(certs, trust_store_path=str(certs.ca), need_client_auth=True)
    b = broker_factory(
        extra_toml=tls + acceptor(certs, "stomp", "stomp", trust_store_path=str(certs.ca), need_client_auth=True)
    ).start()
    refused(tls_url(b, certs.ca))  # no certificate
    refused(tls_url(b, certs.ca, cert=other.client, key=other.client_key))  # one from a CA the server does not trust
    roundtrip(tls_url(b, certs.ca, cert=certs.client, key=certs.client_key))
    for cert in (None, other):
        ctx = ssl.create_default_context(cafile=str(certs.ca))
        if cert is not None:
            ctx.load_cert_chain(str(cert.client), str(cert.client_key))
        with socket.create_connection(("127.0.0.1", b.ports["stomp"]), timeout=5) as raw:
            with pytest.raises((ssl.SSLError, ConnectionError)):
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                    s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\0")
                    assert s.recv(100) == b""  # TLS 1.3: the server's alert arrives after the handshake
                    raise ConnectionError("closed")
    assert "Traceback" not in b.log_text()


MAPPED_USERS = {"app": ("secret", ["app"]), "ops": ("ops-secret", ["ops"])}  # the users file
MAPPED = (
    '[[cert-user-mapping]]\nuser = "app"\ncn = "tandem-client"\n'
    '[[cert-user-mapping]]\nuser = "ops"\nsubject = "CN=ops-[0-9]+,O=Tandem dev"\n'
    '[security-settings."#"]\nsend = ["app"]\nconsume = ["app"]\ncreate-address = ["app"]\n'
    'create-durable-queue = ["app"]\nview = ["ops"]\n'
)


def test_mutual_tls_maps_a_certificate_to_a_user(broker_factory: Factory, certs: DevCerts, tmp_path: Path) -> None:
    ops = write_dev_certs(tmp_path / "ops", client_cn="ops-7")
    # The ops certificate comes from its own CA: the trust store holds both.
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(certs.ca.read_bytes() + ops.ca.read_bytes())
    stranger = write_dev_certs(tmp_path / "stranger", client_cn="stranger")
    bundle.write_bytes(bundle.read_bytes() + stranger.ca.read_bytes())
    tls = acceptor(certs, trust_store_path=str(bundle))  # certificates asked for, not required
    b = broker_factory(
        security_enabled=True,
        cluster_password="pair-secret",
        extra_toml=MAPPED + tls + acceptor(certs, "stomp", "stomp", trust_store_path=str(bundle)),
    )
    write_users(users_path(b), MAPPED_USERS)
    b.start()
    # The certificate logs in without a password, as its mapped user (cn, then a subject regex).
    roundtrip(tls_url(b, certs.ca, cert=certs.client, key=certs.client_key))
    with tandem.connect(tls_url(b, certs.ca, cert=ops.client, key=ops.client_key)) as conn:
        assert conn.manage("broker.status")["state"] == "active"
    # Naming the mapped user is fine; naming another without its password is not.
    roundtrip(tls_url(b, certs.ca, cert=certs.client, key=certs.client_key, username="app"))
    with pytest.raises(tandem.Unauthorized):
        tandem.connect(tls_url(b, certs.ca, cert=certs.client, key=certs.client_key, username="ops")).close()
    # No certificate, or one that maps to nobody: a password is needed as before.
    with pytest.raises(tandem.Unauthorized):
        tandem.connect(tls_url(b, certs.ca)).close()
    with pytest.raises(tandem.Unauthorized):
        tandem.connect(tls_url(b, certs.ca, cert=stranger.client, key=stranger.client_key)).close()
    roundtrip(tls_url(b, certs.ca, username="app", password="secret"))
    # STOMP: CONNECT without login or passcode is the certificate's user.
    for cert, ok in ((certs, True), (None, False)):
        ctx = ssl.create_default_context(cafile=str(certs.ca))
        if cert is not None:
            ctx.load_cert_chain(str(cert.client), str(cert.client_key))
        with socket.create_connection(("127.0.0.1", b.ports["stomp"]), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\0")
                reply = s.recv(4096)
        assert reply.startswith(b"CONNECTED" if ok else b"ERROR"), reply
    assert "Traceback" not in b.log_text()


def test_a_client_that_never_finishes_the_tls_handshake_is_cut(broker_factory: Factory, certs: DevCerts) -> None:
    b = broker_factory(handshake_timeout=500, extra_toml=acceptor(certs)).start()
    silent = socket.create_connection(("127.0.0.1", b.port), timeout=10)
    half = socket.create_connection(("127.0.0.1", b.port), timeout=10)
    half.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # the start of a ClientHello, no more
    t0 = time.monotonic()
    for s in (silent, half):
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass
        s.close()
    assert time.monotonic() - t0 < 8  # cut by the deadline (0.5 s), well before the recv timeout
    roundtrip(tls_url(b, certs.ca))  # the broker serves others meanwhile


def _wait_for(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.1)


def _connects(url: str) -> bool:
    try:
        tandem.connect(url, connect_timeout=2000).close()
    except tandem.TandemError:
        return False
    return True


@pytest.mark.parametrize("how", ["file-change", "sighup"])
def test_certificates_are_reloaded_for_new_connections(
    broker_factory: Factory, certs: DevCerts, tmp_path: Path, how: str
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    for f in (certs.server, certs.server_key):
        shutil.copy(f, live / f.name)
    # With SIGHUP the files are not watched between rounds: a check period of a minute.
    period = 60_000 if how == "sighup" else 200
    b = broker_factory(
        connection_check_period=period,
        extra_toml=acceptor(
            DevCerts(
                certs.ca, certs.ca_key, live / "server.pem", live / "server-key.pem", certs.client, certs.client_key
            )
        ),
    ).start()
    before = tandem.connect(tls_url(b, certs.ca))
    try:
        renewed = write_dev_certs(tmp_path / "renewed", ca_cn="Renewed CA")
        for f in (renewed.server, renewed.server_key):
            tmp = live / (f.name + ".tmp")
            shutil.copy(f, tmp)
            os.replace(tmp, live / f.name)
        if how == "sighup":
            time.sleep(0.5)
            assert _connects(tls_url(b, certs.ca)), "reloaded without SIGHUP"
            b.signal(signal.SIGHUP)
        _wait_for(lambda: _connects(tls_url(b, renewed.ca)))
        assert not _connects(tls_url(b, certs.ca))
        # The connection made before the reload carries on.
        assert before.manage("broker.status")["state"] == "active"
    finally:
        before.close()
    assert "TLS certificate reloaded" in b.log_text()


def test_cli_takes_tls_urls_and_writes_dev_certificates(broker_factory: Factory, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_URL"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tandem", *args], capture_output=True, text=True, timeout=60, env=env
        )

    r = cli("certs", "dev", "--out", str(tmp_path / "dev"))
    assert r.returncode == 0, r.stderr
    assert "not for production" in r.stdout.lower()
    for name in ("ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem"):
        assert (tmp_path / "dev" / name).stat().st_size > 0
    assert (tmp_path / "dev" / "server-key.pem").stat().st_mode & 0o077 == 0  # keys readable by the owner only
    dev = tmp_path / "dev"
    b = broker_factory(
        extra_toml=acceptor(
            DevCerts(
                dev / "ca.pem",
                dev / "ca-key.pem",
                dev / "server.pem",
                dev / "server-key.pem",
                dev / "client.pem",
                dev / "client-key.pem",
            )
        )
    ).start()
    url = tls_url(b, dev / "ca.pem")
    r = cli("producer", "--url", url, "--destination", "cli.tls", "--count", "3")
    assert r.returncode == 0, r.stderr
    r = cli("consumer", "--url", url, "--destination", "cli.tls", "--count", "3")
    assert r.returncode == 0, r.stderr


def test_a_ca_dropped_from_the_trust_store_is_refused_after_reload(
    broker_factory: Factory, certs: DevCerts, other: DevCerts, tmp_path: Path
) -> None:
    """The reload swaps the whole context: a CA removed from the trust store no longer lets clients in."""
    store = tmp_path / "clients-ca.pem"
    store.write_bytes(certs.ca.read_bytes() + other.ca.read_bytes())
    b = broker_factory(
        connection_check_period=200, extra_toml=acceptor(certs, trust_store_path=str(store), need_client_auth=True)
    ).start()
    mine = tls_url(b, certs.ca, cert=certs.client, key=certs.client_key)
    theirs = tls_url(b, certs.ca, cert=other.client, key=other.client_key)
    assert _connects(mine) and _connects(theirs)
    tmp = tmp_path / "clients-ca.pem.tmp"
    tmp.write_bytes(certs.ca.read_bytes())
    os.replace(tmp, store)
    _wait_for(lambda: not _connects(theirs))
    assert _connects(mine)
    assert "TLS certificate reloaded" in b.log_text()
