"""The web console's files (src/tandem/management/console/) served by the management listener:
public, so the login page loads before anyone logs in, while /api stays closed; nothing else of
the package is reachable through them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from broker_process import BrokerProcess
from mgmt_http import Api, management_toml
from secured import secured

Factory = Callable[..., BrokerProcess]
CONSOLE = Path(__file__).parents[2] / "src" / "tandem" / "management" / "console"


def test_console_files_are_public_and_the_api_is_not(broker_factory: Factory, tmp_path: Path) -> None:
    b = broker_factory(**secured(tmp_path, {"admin": ["admin"]}, management_toml())).start()
    api = Api.of(b)
    index = api.get("/")
    assert index.status == 200
    assert index.headers["content-type"].startswith("text/html")
    assert index.body == (CONSOLE / "index.html").read_bytes()
    csp = index.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert index.headers["x-content-type-options"] == "nosniff"
    for name, kind in (("app.js", "javascript"), ("style.css", "text/css")):
        a = api.get(f"/console/{name}")
        assert a.status == 200, name
        assert kind in a.headers["content-type"]
        assert a.body == (CONSOLE / name).read_bytes()
    assert api.get("/console/missing.js").status == 404
    # The static route serves that directory only.
    for path in ("/console/../app.py", "/console/%2e%2e/app.py", "/console/..%2fapp.py"):
        a = api.get(path)
        assert a.status in (403, 404), (path, a.status)
        assert b"ManagementServer" not in a.body
    # The API still wants a login.
    assert api.get("/api/overview").status == 401
