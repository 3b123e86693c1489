"""Logging in to the HTTP management API with security on (docs/management.md "Authentication"):
HTTP basic and the session cookie, 401 and 403, the view and edit roles, CSRF, the audit log."""

from __future__ import annotations

import re
import signal
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_process import BrokerProcess
from mgmt_http import Api, management_toml
from secured import password_of, secured, url_for, write_users_file
from tandem.certs import write_dev_certs
from tandem.client.blocking import connect

Factory = Callable[..., BrokerProcess]
USERS = {"admin": ["admin"], "viewer": ["viewer"], "editor": ["editor"], "app": ["app"]}
SETTINGS = (
    '[security-settings."#"]\n'
    'manage = ["admin"]\nview = ["viewer"]\nedit = ["editor"]\n'
    'send = ["app", "admin"]\nconsume = ["app", "admin"]\ncreate-address = ["app", "admin"]\n'
    'create-durable-queue = ["app", "admin"]\n'
)


def secured_broker(broker_factory: Factory, tmp_path: Path, management: str = "", **kw: object) -> BrokerProcess:
    """A secured broker with the management listener (users in `tmp_path`, where broker_factory
    writes configs); `kw`: broker_factory's (a `name` for a second broker)."""
    toml = management or management_toml()
    return broker_factory(**kw, **secured(tmp_path, USERS, SETTINGS + toml)).start()  # type: ignore[no-any-return]


def basic(b: BrokerProcess, user: str) -> Api:
    return Api.of(b, basic=(user, password_of(user)))


def fill(b: BrokerProcess, queue: str, n: int) -> None:
    with connect(url_for(b.url, "app")) as conn:
        p = conn.session().create_producer(queue)
        for i in range(n):
            p.send(f"m{i}".encode())


def test_nobody_gets_in_without_logging_in(broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path)
    a = Api.of(b).get("/api/overview")
    assert a.status == 401 and a.code == "UNAUTHORIZED"
    assert a.headers["www-authenticate"] == 'Basic realm="tandem"'
    # The console asks with X-Requested-With: no browser password dialog, its own login page.
    a = Api.of(b).get("/api/overview", headers={"X-Requested-With": "XMLHttpRequest"})
    assert a.status == 401 and "www-authenticate" not in a.headers
    a = Api.of(b, basic=("viewer", "wrong")).get("/api/overview")
    assert a.status == 401 and a.code == "UNAUTHORIZED"
    a = Api.of(b, basic=("nobody", "x")).get("/api/overview")
    assert a.status == 401
    a = Api.of(b).get("/api/overview", headers={"Authorization": "Bearer abc"})
    assert a.status == 401
    a = Api.of(b).get("/api/overview", headers={"Cookie": "tandem_session=forged"})
    assert a.status == 401


def test_view_reads_edit_changes_manage_does_both(broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path)
    fill(b, "orders", 3)
    assert basic(b, "viewer").ok("GET", "/api/overview")["messages"] == 3
    assert basic(b, "admin").ok("GET", "/api/overview")["messages"] == 3
    a = basic(b, "editor").get("/api/overview")  # edit alone does not read
    assert a.status == 403 and a.code == "UNAUTHORIZED"
    a = basic(b, "app").get("/api/overview")  # an application user: no management at all
    assert a.status == 403 and a.code == "UNAUTHORIZED"
    a = basic(b, "viewer").request("DELETE", "/api/queues/orders/messages")
    assert a.status == 403 and a.code == "UNAUTHORIZED"
    assert basic(b, "admin").ok("GET", "/api/overview")["messages"] == 3  # the refusal removed nothing
    assert basic(b, "editor").ok("DELETE", "/api/queues/orders/messages") == {"removed": 3}
    fill(b, "orders", 2)
    assert basic(b, "admin").ok("DELETE", "/api/queues/orders/messages") == {"removed": 2}


def test_session_cookie_and_csrf(broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path)
    fill(b, "orders", 4)
    api = Api.of(b)
    a = api.login("admin", "wrong")
    assert a.status == 401 and a.code == "UNAUTHORIZED"
    a = api.login("admin", password_of("admin"))
    assert a.status == 200, a.body
    assert a.json["user"] == "admin" and a.json["roles"] == ["admin"] and a.json["security"] is True
    cookie = a.headers["set-cookie"]
    assert "tandem_session=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert api.ok("GET", "/api/overview")["messages"] == 4
    me = api.ok("GET", "/api/whoami")
    assert me["user"] == "admin" and me["csrf"] == a.json["csrf"]
    # A change with the cookie needs the token: a page of another site cannot read it.
    r = api.request("DELETE", "/api/queues/orders/messages")
    assert r.status == 403 and "X-Tandem-CSRF" in r.json["error"]["message"]
    r = api.request("DELETE", "/api/queues/orders/messages", headers={"X-Tandem-CSRF": "guess"})
    assert r.status == 403
    assert api.ok("GET", "/api/overview")["messages"] == 4
    assert api.ok("DELETE", "/api/queues/orders/messages") == {"removed": 4}  # ok() sends the token
    # Logged out: the cookie no longer works, even if kept.
    token = api.cookie
    assert api.ok("POST", "/api/logout")["logged_out"] is True
    api.cookie = token
    assert api.get("/api/overview").status == 401


def test_a_session_follows_the_users_file(broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path)
    api = Api.of(b)
    assert api.login("viewer", password_of("viewer")).status == 200
    assert api.ok("GET", "/api/overview")["state"] == "active"
    write_users_file(tmp_path, {**USERS, "viewer": ["app"]})  # viewer loses its view role
    b.signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while api.get("/api/overview").status == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert api.get("/api/overview").status == 403
    write_users_file(tmp_path, {k: v for k, v in USERS.items() if k != "viewer"})  # and is removed
    b.signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while api.get("/api/overview").status == 403 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert api.get("/api/overview").status == 401


def test_the_cluster_pair_cannot_log_in_to_the_api(broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path)
    a = Api.of(b).login("tandem.cluster", "pair-secret")
    assert a.status == 403 and a.code == "UNAUTHORIZED"
    assert Api.of(b, basic=("tandem.cluster", "pair-secret")).get("/api/overview").status == 403


def test_operations_are_audited_with_the_http_user(broker_factory: Factory, tmp_path: Path) -> None:
    b = secured_broker(broker_factory, tmp_path, audit_log=True)
    fill(b, "orders", 1)
    basic(b, "editor").ok("DELETE", "/api/queues/orders/messages")
    assert basic(b, "viewer").request("DELETE", "/api/queues/orders/messages").status == 403
    api = Api.of(b)
    api.login("admin", password_of("admin"))
    deadline = time.monotonic() + 10
    pattern = re.compile(r"user=editor peer=127\.0\.0\.1:\d+ event=queue\.purge target=orders allowed=yes")
    while not pattern.search(b.log_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    log = b.log_text()
    assert pattern.search(log), log
    assert re.search(r"user=viewer peer=127\.0\.0\.1:\d+ event=queue\.purge target=orders allowed=no", log), log
    assert re.search(r"user=admin peer=127\.0\.0\.1:\d+ event=login target=- allowed=yes protocol=http", log), log


def test_passwords_only_over_tls_or_loopback(broker_factory: Factory, tmp_path: Path) -> None:
    """A listener on a network address without TLS takes no password (basic or login): it would
    cross the network in clear. With TLS it does."""
    b = secured_broker(broker_factory, tmp_path, management=management_toml("0.0.0.0:0"))
    a = Api.of(b, basic=("viewer", password_of("viewer"))).get("/api/overview")
    assert a.status == 403 and "TLS" in a.json["error"]["message"]
    a = Api.of(b).login("viewer", password_of("viewer"))
    assert a.status == 403 and "TLS" in a.json["error"]["message"]
    assert "without TLS" in b.log_text()

    certs = write_dev_certs(tmp_path / "certs")
    tls = f'ssl-enabled = true\ncert-path = "{certs.server}"\nkey-path = "{certs.server_key}"\n'
    t = secured_broker(broker_factory, tmp_path, management=management_toml("0.0.0.0:0", tls), name="t")
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    assert Api.of(t, tls=ctx, basic=("viewer", password_of("viewer"))).ok("GET", "/api/overview")["state"] == "active"
    api = Api.of(t, tls=ctx)
    a = api.login("viewer", password_of("viewer"))
    assert a.status == 200 and "Secure" in a.headers["set-cookie"]
    assert api.ok("GET", "/api/overview")["state"] == "active"
    with pytest.raises(OSError):  # plain HTTP to a TLS listener gets nowhere
        Api.of(t).get("/api/overview")


def test_a_mapped_client_certificate_logs_in_without_a_password(broker_factory: Factory, tmp_path: Path) -> None:
    certs = write_dev_certs(tmp_path / "certs")
    tls = (
        f'ssl-enabled = true\ncert-path = "{certs.server}"\nkey-path = "{certs.server_key}"\n'
        f'trust-store-path = "{certs.ca}"\n'
    )
    mapping = '[[cert-user-mapping]]\nuser = "viewer"\ncn = "tandem-client"\n'
    b = secured_broker(broker_factory, tmp_path, management=management_toml("127.0.0.1:0", tls) + mapping)
    with_cert = ssl.create_default_context(cafile=str(certs.ca))
    with_cert.load_cert_chain(str(certs.client), str(certs.client_key))
    api = Api.of(b, tls=with_cert)
    assert api.ok("GET", "/api/whoami")["user"] == "viewer"
    assert api.ok("GET", "/api/overview")["state"] == "active"
    a = api.request("DELETE", "/api/queues/orders/messages")  # viewer: no edit
    assert a.status == 403 and a.code == "UNAUTHORIZED"
    # Basic, when sent, says who instead.
    assert Api.of(b, tls=with_cert, basic=("admin", password_of("admin"))).ok("GET", "/api/whoami")["user"] == "admin"
    without = ssl.create_default_context(cafile=str(certs.ca))
    assert Api.of(b, tls=without).get("/api/overview").status == 401


def test_a_change_from_another_sites_page_is_refused_even_with_credentials(
    broker_factory: Factory, tmp_path: Path
) -> None:
    """A browser re-sends cached basic credentials (and client certificates) to any page's
    requests: the Origin check stops a change another site's page makes with them."""
    b = secured_broker(broker_factory, tmp_path)
    fill(b, "orders", 2)
    a = basic(b, "admin").request("DELETE", "/api/queues/orders/messages", headers={"Origin": "https://evil.example"})
    assert a.status == 403 and "another site" in a.json["error"]["message"]
    assert basic(b, "admin").ok("GET", "/api/queues/orders")["message_count"] == 2
