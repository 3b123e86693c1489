"""`security-enabled` against real broker processes: who may log in, over native and STOMP.

The cluster pair (`cluster-user`/`cluster-password`) is accepted like a user, so its built-in
value must never open a secured broker; passwords are compared as text of any script.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from urllib.parse import quote

import pytest

import tandem
from broker_process import BrokerProcess
from users import users_path, write_users

Factory = Callable[..., BrokerProcess]
ACCEPTORS = (
    '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
    '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
)
APP = {"app": ("secret", ["admin"])}
PERMS = '[security-settings."#"]\nmanage = ["admin"]\n'  # app may stop the broker (decision 0060)
BUILTIN_USER, BUILTIN_PASSWORD = "tandem.cluster", "change me"


def url_with(b: BrokerProcess, user: str, password: str) -> str:
    return f"{b.url}?username={quote(user)}&password={quote(password)}"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_URL"}
    return subprocess.run([sys.executable, "-m", "tandem", *args], capture_output=True, text=True, timeout=60, env=env)


def stomp_connect(port: int, login: str, passcode: str) -> bytes:
    """CONNECT with these credentials; everything the broker sends until it closes or 2 s pass."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"CONNECT\naccept-version:1.2\nhost:x\nlogin:{login}\npasscode:{passcode}\n\n\0".encode())
        got = b""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            s.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            got += chunk
            if got.startswith(b"CONNECTED") and b"\0" in got:
                break
        return got


@pytest.mark.parametrize(
    "cluster",
    [
        "",  # cluster-user and cluster-password left at their built-in values
        f'cluster-password = "{BUILTIN_PASSWORD}"\n',
        'cluster-password = ""\n',
        'cluster-user = "ops"\n',
    ],
    ids=["defaults", "builtin-password", "empty-password", "own-user-builtin-password"],
)
def test_a_secured_broker_does_not_start_with_the_builtin_cluster_password(
    broker_factory: Factory, cluster: str
) -> None:
    """Otherwise anyone could log in (and `tandem admin stop` it) as the cluster user."""
    b = broker_factory(security_enabled=True, extra_toml=cluster + ACCEPTORS + PERMS)
    write_users(users_path(b), APP)
    with pytest.raises(RuntimeError) as info:
        b.start()
    text = str(info.value)
    assert "exited with 2" in text, text
    assert "configuration error" in text and "cluster-password" in text and "cluster-user" in text, text
    assert "Traceback" not in text, text


def test_the_builtin_pair_cannot_stop_a_secured_broker(broker_factory: Factory) -> None:
    b = broker_factory(security_enabled=True, cluster_password="pair-secret", extra_toml=ACCEPTORS + PERMS)
    write_users(users_path(b), APP)
    b.start()
    r = cli("admin", "stop", "--url", url_with(b, BUILTIN_USER, BUILTIN_PASSWORD))
    assert r.returncode != 0 and "UNAUTHORIZED" in r.stderr, (r.returncode, r.stdout, r.stderr)
    got = stomp_connect(b.ports["stomp"], BUILTIN_USER, BUILTIN_PASSWORD)
    assert got.startswith(b"ERROR") and b"authentication failed" in got, got
    time.sleep(0.3)  # a stop would have begun by now (it is scheduled 50 ms after its reply)
    assert b.running
    # The configured pairs still log in: the app user, and the cluster pair (a backup announces with
    # it; it may do no more: test_permissions.py).
    for user, password in (("app", "secret"), (BUILTIN_USER, "pair-secret")):
        with tandem.connect(url_with(b, user, password)) as conn:
            assert conn.node_id
        assert stomp_connect(b.ports["stomp"], user, password).startswith(b"CONNECTED")
    r = cli("admin", "stop", "--url", url_with(b, "app", "secret"))
    assert r.returncode == 0, r.stderr
    assert b.wait_exit(20) == 0


def test_passwords_in_any_script_are_compared(broker_factory: Factory) -> None:
    """Names and passwords are UTF-8 (the hash of the bytes, the pair compared constant-time), so a
    non-ASCII password works (and a wrong one fails)."""
    b = broker_factory(
        security_enabled=True, cluster_password="пароль кластера", login_failure_delay=10, extra_toml=ACCEPTORS
    )
    write_users(users_path(b), {"jürgen": ("pässwört ключ", [])})
    b.start()
    for user, password in (("jürgen", "pässwört ключ"), (BUILTIN_USER, "пароль кластера")):
        with tandem.connect(url_with(b, user, password)) as conn:
            assert conn.node_id  # logged in
        assert stomp_connect(b.ports["stomp"], user, password).startswith(b"CONNECTED")
    for user, password in (("jürgen", "pässwört ключь"), ("jürgen", "secret"), (BUILTIN_USER, BUILTIN_PASSWORD)):
        with pytest.raises(tandem.Unauthorized):
            tandem.connect(url_with(b, user, password)).close()
        got = stomp_connect(b.ports["stomp"], user, password)
        assert got.startswith(b"ERROR") and b"authentication failed" in got, got
    assert "internal error" not in b.log_text() and "Traceback" not in b.log_text()
