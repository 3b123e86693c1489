"""The management API's parts that need no broker: rates, login sessions, HTTP basic, routes."""

from __future__ import annotations

import base64
from dataclasses import dataclass

import pytest

from tandem.errors import InvalidArgument
from tandem.management import auth
from tandem.management.routes import ROUTES, Route, boolean, integer
from tandem.server.authorization import EDIT_OPS, VIEW_OPS
from tandem.server.rates import RateTracker


@dataclass
class Q:
    name: str
    messages_added: int = 0
    messages_acked: int = 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rates_over_the_window_and_never_negative() -> None:
    clock = Clock()
    r = RateTracker(clock)
    a, b = Q("a"), Q("b")
    r.sample([a, b])
    assert r.totals() == {"in": None, "out": None} and r.of("a") == {"added": None, "acked": None}
    for _ in range(20):  # 10 msg/s into a for 20 s, 2 msg/s out
        clock.now += 1
        a.messages_added += 10
        a.messages_acked += 2
        r.sample([a, b])
    assert r.of("a") == {"added": 10.0, "acked": 2.0}
    assert r.of("b") == {"added": 0.0, "acked": 0.0}
    assert r.totals() == {"in": 10.0, "out": 2.0}
    assert len(r._samples) <= 12  # the window and one sample before it
    r.sample([a, b])  # less than a second later: not taken
    assert len(r._samples) <= 12 and r._samples[-1].at == clock.now
    clock.now += 1
    r.sample([Q("a")])  # a re-created: its counters start over; no negative rate
    assert r.of("a")["added"] == 0.0 and r.of("b") == {"added": None, "acked": None}
    r.clear()
    assert r.totals() == {"in": None, "out": None}


def test_sessions_expire_when_idle_and_are_bounded() -> None:
    clock = Clock()
    s = auth.Sessions(60.0, clock)
    token, session = s.create("ann")
    assert s.get(token) is session and session.user == "ann" and session.csrf != token
    clock.now += 59
    assert s.get(token) is session  # a request starts its idle time over
    clock.now += 59
    assert s.get(token) is session
    clock.now += 61
    assert s.get(token) is None and len(s) == 0
    t2, _ = s.create("bob")
    s.drop(t2)
    assert s.get(t2) is None
    assert s.get("forged") is None
    assert token not in repr(s._by_key)  # found by a hash of the token, never the token itself


def test_sessions_past_the_limit_drop_the_least_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "MAX_SESSIONS", 3)
    s = auth.Sessions(60.0, Clock())
    t1, _ = s.create("a")
    t2, _ = s.create("b")
    t3, _ = s.create("c")
    assert s.get(t1) is not None  # a used again: b is now the least recently used
    t4, _ = s.create("d")
    assert len(s) == 3 and s.get(t2) is None
    assert all(s.get(t) is not None for t in (t1, t3, t4))


def test_csrf_check() -> None:
    _, session = auth.Sessions(60.0, Clock()).create("a")
    assert auth.csrf_ok(session, session.csrf)
    assert not auth.csrf_ok(session, None) and not auth.csrf_ok(session, "x") and not auth.csrf_ok(session, "é")


def _basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


def test_basic_credentials() -> None:
    assert auth.basic_credentials(_basic("ann:s3:cret")) == ("ann", "s3:cret")  # the first colon splits
    assert auth.basic_credentials(_basic("zoë:pässword")) == ("zoë", "pässword")
    assert auth.basic_credentials(_basic("ann:")) == ("ann", "")
    assert auth.basic_credentials(_basic("no-colon")) is None
    assert auth.basic_credentials("Bearer abc") is None
    assert auth.basic_credentials("Basic !!!") is None
    assert auth.basic_credentials("Basic " + base64.b64encode(b"\xff:x").decode()) is None


def test_route_arguments() -> None:
    r = Route(
        "GET", "/api/things/{name}/{n}", "thing.op", query={"page": integer, "on": boolean}, placeholders={"n": integer}
    )
    assert r.args({"name": "a b", "n": "3"}, {"page": "2", "on": "yes"}, None) == {
        "name": "a b",
        "n": 3,
        "page": 2,
        "on": True,
    }
    with pytest.raises(InvalidArgument, match="unknown query parameter `pge`"):
        r.args({"name": "x", "n": "1"}, {"pge": "2"}, None)
    with pytest.raises(InvalidArgument, match="`page`"):
        r.args({"name": "x", "n": "1"}, {"page": "two"}, None)
    with pytest.raises(InvalidArgument, match="`n` in the path"):
        r.args({"name": "x", "n": "one"}, {}, None)
    with pytest.raises(InvalidArgument, match="true or false"):
        r.args({"name": "x", "n": "1"}, {"on": "maybe"}, None)
    b = Route("POST", "/api/x/{name}", "x.op", body=True, fixed={"always": 1})
    assert b.args({"name": "q"}, {}, {"to": "y", "name": "ignored"}) == {"to": "y", "name": "q", "always": 1}
    assert b.args({"name": "q"}, {}, None) == {"name": "q", "always": 1}
    with pytest.raises(InvalidArgument, match="JSON object"):
        b.args({"name": "q"}, {}, [1, 2])


def test_every_route_op_has_a_permission_class() -> None:
    for route in ROUTES:
        assert route.op in VIEW_OPS or route.op in EDIT_OPS, route.op
        assert (route.op in VIEW_OPS) == (route.method == "GET"), route


def test_a_queue_created_within_the_window_has_a_rate_from_its_first_sample() -> None:
    clock = Clock()
    r = RateTracker(clock)
    r.sample([Q("old")])
    clock.now += 1
    new = Q("new")
    r.sample([Q("old"), new])
    assert r.of("new") == {"added": None, "acked": None}  # one sample only
    clock.now += 2
    new.messages_added = 8
    r.sample([Q("old"), new])
    assert r.of("new") == {"added": 4.0, "acked": 0.0}


def test_host_names() -> None:
    assert auth.host_name("127.0.0.1:8161") == "127.0.0.1"
    assert auth.host_name("localhost") == "localhost"
    assert auth.host_name("[::1]:8161") == "::1"
    assert auth.host_name("evil.example:80") == "evil.example"


def test_cross_site_changes() -> None:
    here = "127.0.0.1:8161"
    assert not auth.cross_site("GET", here, "http://evil.example", "cross-site")  # reads: CORS keeps them unread
    assert not auth.cross_site("DELETE", here, None, None)  # curl, a script
    assert not auth.cross_site("POST", here, "http://127.0.0.1:8161", "same-origin")
    assert not auth.cross_site("POST", here, "https://127.0.0.1:8161/", None)
    assert auth.cross_site("POST", here, "http://evil.example", None)
    assert auth.cross_site("POST", here, "http://127.0.0.1:8162", None)
    assert auth.cross_site("DELETE", here, "null", None)
    assert auth.cross_site("DELETE", here, None, "cross-site")
    assert auth.cross_site("DELETE", None, "http://127.0.0.1:8161", None)
