"""A small HTTP client for the management API tests: real requests on 127.0.0.1 (http.client),
with a session cookie kept between requests, and the answer's status, headers and JSON."""

from __future__ import annotations

import base64
import http.client
import json
import ssl
from dataclasses import dataclass, field
from typing import Any

from broker_process import BrokerProcess

TIMEOUT = 30.0


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def code(self) -> str:
        """The error code of an error answer."""
        return str(self.json["error"]["code"])


@dataclass
class Api:
    """Requests to one management listener. `basic`: (user, password) sent with every request;
    a login keeps the session cookie (and its CSRF token) for the next ones."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None
    basic: tuple[str, str] | None = None
    cookie: str | None = None
    csrf: str | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, b: BrokerProcess, **kw: Any) -> Api:
        return cls("127.0.0.1", b.ports["management"], **kw)

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, raw: bytes | None = None
    ) -> Answer:
        if self.tls is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=TIMEOUT, context=self.tls
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)
        h = dict(self.extra_headers)
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        if self.basic is not None:
            h["Authorization"] = "Basic " + base64.b64encode(f"{self.basic[0]}:{self.basic[1]}".encode()).decode()
        if self.cookie is not None:
            h["Cookie"] = f"tandem_session={self.cookie}"
        h.update(headers or {})
        try:
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            answer = Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()
        return answer

    def get(self, path: str, **kw: Any) -> Answer:
        return self.request("GET", path, **kw)

    def ok(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        """The JSON of a request that must succeed (with the CSRF token after a login)."""
        headers = {"X-Tandem-CSRF": self.csrf} if self.csrf and method not in ("GET", "HEAD") else {}
        a = self.request(method, path, body, headers=headers)
        assert a.status == status, (method, path, a.status, a.body)
        return a.json

    def login(self, user: str, password: str) -> Answer:
        a = self.request("POST", "/api/login", {"username": user, "password": password})
        if a.status == 200:
            cookie = a.headers.get("set-cookie", "")
            self.cookie = cookie.split(";", 1)[0].split("=", 1)[1]
            self.csrf = a.json["csrf"]
        return a


def management_toml(bind: str = "127.0.0.1:0", extra: str = "") -> str:
    """The `[management]` table of a test broker (an OS-chosen port unless told)."""
    return f'\n[management]\nbind = "{bind}"\n{extra}'
