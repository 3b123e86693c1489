"""Users and passwords (issue 17, decision 0059) against real broker processes.

The users file holds scrypt hashes; plain text is refused at start; `tandem user` edits it and
a running broker picks the change up (every `security-invalidation-interval`, or on SIGHUP);
nothing a client sends after HELLO/CONNECT runs before its password is checked; a peer guessing
passwords is slowed down without slowing anyone else; and fuzzed logins get a clear refusal.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tandem
from broker_process import BrokerProcess
from tandem.errors import ErrorCode
from tandem.protocol import native as p
from tandem.protocol.stomp import SERVER_COMMANDS, Frame, StompParser, negotiate
from users import users_path, write_users

Factory = Callable[..., BrokerProcess]
ACCEPTORS = (
    '[[acceptors]]\nname = "native"\nbind = "127.0.0.1:0"\n'
    '[[acceptors]]\nname = "stomp"\nprotocol = "stomp"\nbind = "127.0.0.1:0"\n'
)
APP = {"app": ("secret", ["app"])}
# app may do everything (decision 0060: a secured broker allows only what security-settings grant)
APP_MAY_ALL = '[security-settings."#"]\n' + "".join(
    f'{p} = ["app"]\n'
    for p in (
        "send", "consume", "browse", "create-address", "delete-address", "create-durable-queue",
        "delete-durable-queue", "create-non-durable-queue", "delete-non-durable-queue", "manage", "view", "edit",
    )
)  # fmt: skip
WAIT = 10.0  # s: bound on every wait for the broker in this file


def secured(broker_factory: Factory, users: dict[str, tuple[str, list[str]]], **settings: Any) -> BrokerProcess:
    b = broker_factory(
        security_enabled=True, cluster_password="pair-secret", extra_toml=ACCEPTORS + APP_MAY_ALL, **settings
    )
    write_users(users_path(b), users)
    return b


def url_with(b: BrokerProcess, user: str, password: str) -> str:
    return f"{b.url}?username={quote(user)}&password={quote(password)}&reconnect_attempts=0"


def logs_in(b: BrokerProcess, user: str, password: str) -> bool:
    try:
        with tandem.connect(url_with(b, user, password)) as conn:
            assert conn.node_id  # logged in (what the user may do is decision 0060's)
        return True
    except tandem.Unauthorized:
        return False


def user_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_URL"}
    return subprocess.run(
        [sys.executable, "-m", "tandem", "user", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


class Raw:
    """A raw connection (from `source`, a loopback address of the test's choosing)."""

    def __init__(self, port: int, stomp: bool, source: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
        self.stomp = stomp
        self.native = p.FrameReader(p.ServerPacket, 1 << 26, expect_magic=False)
        self.parser = StompParser(1 << 26, "1.2", SERVER_COMMANDS)
        self.got: list[Any] = []
        self.eof = False

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            self.eof = True

    def read(self, timeout: float, until: Callable[[list[Any]], bool] = lambda got: False) -> list[Any]:
        """What arrives within `timeout`, stopping at EOF or once `until(got)`."""
        deadline = time.monotonic() + timeout
        while not self.eof and not until(self.got):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                break
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                break
            self.got += self.parser.feed(data) if self.stomp else self.native.feed(data)
        return [x for x in self.got if not isinstance(x, p.Ping) and not is_beat(x)]

    def answered(self) -> bool:
        """Anything (or the close) arrived yet? Does not wait."""
        self.read(0.001)
        return self.eof or bool(self.got)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raws() -> Iterator[Callable[..., Raw]]:
    made: list[Raw] = []

    def make(port: int, stomp: bool, source: str = "127.0.0.1") -> Raw:
        r = Raw(port, stomp, source)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def hello(user: str | None, password: str | None, **kw: Any) -> bytes:
    return p.MAGIC + p.encode(p.Hello(p.PROTOCOL_VERSION, username=user, password=password, client_name="t", **kw))


def connect_frame(login: str, passcode: str) -> bytes:
    return f"CONNECT\naccept-version:1.2\nhost:x\nlogin:{login}\npasscode:{passcode}\n\n\0".encode()


def is_beat(x: Any) -> bool:
    return isinstance(x, Frame) and x.command == "HEARTBEAT"


def is_error(x: Any) -> bool:
    return isinstance(x, p.Error) or (isinstance(x, Frame) and x.command == "ERROR")


# ======================================================================= the users file


def test_the_file_holds_hashes_and_only_the_right_password_logs_in(
    broker_factory: Factory, raws: Callable[..., Raw]
) -> None:
    b = secured(broker_factory, {**APP, "ops": ("другой пароль", ["admin"])}, login_failure_delay=10).start()
    text = users_path(b).read_text()
    assert "secret" not in text and "другой" not in text and text.count("scrypt$n=16384,r=8,p=1$") == 2, text
    assert users_path(b).stat().st_mode & 0o077 == 0, "the users file is readable by others"
    assert logs_in(b, "app", "secret") and logs_in(b, "ops", "другой пароль")
    for user, password in (("app", "Secret"), ("app", ""), ("app", "другой пароль"), ("nobody", "secret")):
        assert not logs_in(b, user, password), (user, password)
        r = raws(b.ports["stomp"], True)
        r.send(connect_frame(user, password))
        got = r.read(WAIT)
        assert r.eof and len(got) == 1 and is_error(got[0]), got
        message = got[0].headers["message"]
        assert "authentication failed" in message and (not password or password not in message), message
    ok = raws(b.ports["stomp"], True)
    ok.send(connect_frame("ops", "другой пароль"))
    assert ok.read(WAIT, until=bool)[0].command == "CONNECTED"
    assert "Traceback" not in b.log_text()


@pytest.mark.parametrize(
    "entry",
    [
        'password = "secret"',  # plain text
        'password = "$2b$12$R9h/cIPz0gi.URNNX3kh2OPST9/PgBkqquzi.Ss7KIUgO2t0jWMUW"',  # bcrypt: not ours
        'password = "scrypt$n=1000,r=8,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA=="',  # n not a power of two
    ],
    ids=["plain", "other-scheme", "bad-cost"],
)
def test_a_password_that_is_not_a_hash_stops_the_start_naming_the_user(broker_factory: Factory, entry: str) -> None:
    b = secured(broker_factory, APP)
    good = users_path(b).read_text()  # app's entry, hashed
    users_path(b).write_text(f'{good}\n[users."mallory"]\n{entry}\n')
    with pytest.raises(RuntimeError) as info:
        b.start()
    text = str(info.value)
    assert "exited with 2" in text and "configuration error" in text, text
    assert "'mallory'" in text and "plain-text" in text and "tandem user passwd mallory" in text, text
    assert "secret" not in text and "Traceback" not in text, text
    # `tandem user` reads such a file (to fix it), shows the entry as unusable, and `passwd` fixes it.
    listed = user_cli("list", "--users-file", str(users_path(b)))
    assert "mallory" in listed.stdout and "NOT A HASH" in listed.stdout, listed
    r = user_cli("passwd", "mallory", "--users-file", str(users_path(b)), stdin="now hashed\n")
    assert r.returncode == 0, r.stderr
    fixed = broker_factory(
        "fixed", security_enabled=True, cluster_password="pair-secret", extra_toml=ACCEPTORS + APP_MAY_ALL
    )
    fixed.start()  # the same users file (next to both configs)
    assert logs_in(fixed, "mallory", "now hashed") and logs_in(fixed, "app", "secret")


def test_a_secured_broker_needs_its_users_file_and_refuses_users_in_its_config(broker_factory: Factory) -> None:
    b = secured(broker_factory, APP)
    users_path(b).unlink()
    with pytest.raises(RuntimeError) as info:
        b.start()
    text = str(info.value)
    assert "exited with 2" in text and "does not exist" in text and "tandem user add" in text, text
    in_config = '[[users]]\nname = "app"\npassword = "s3"\n'
    old = broker_factory("old", security_enabled=True, cluster_password="pair-secret", extra_toml=in_config)
    write_users(users_path(old), APP)
    with pytest.raises(RuntimeError) as info:
        old.start()
    text = str(info.value)
    assert "exited with 2" in text and "`[[users]]` ('app')" in text and "tandem user add" in text, text
    assert "s3" not in text, text


# ============================================================ changes while running


def test_a_user_added_while_running_logs_in_after_the_invalidation_interval(broker_factory: Factory) -> None:
    b = secured(broker_factory, APP, security_invalidation_interval=300, login_failure_max_delay=100).start()
    assert not logs_in(b, "late", "pw late")
    config = ("--config", str(b.config_path))
    r = user_cli("add", "late", "--roles", "producer,consumer", *config, stdin="pw late\npw late\n")
    assert r.returncode == 0, r.stderr
    assert logs_in(b, "app", "secret"), "the users already there still log in"
    deadline = time.monotonic() + WAIT
    while not logs_in(b, "late", "pw late"):
        assert time.monotonic() < deadline, f"the new user could not log in within {WAIT}s:\n{b.log_text()}"
        time.sleep(0.2)
    assert "reloaded" in b.log_text()
    listed = user_cli("list", "--config", str(b.config_path), "--json")
    assert '"name": "late"' in listed.stdout and '"roles": "consumer,producer"' in listed.stdout, listed.stdout
    # A new password replaces the old one; a removed user no longer logs in.
    assert user_cli("passwd", "late", "--config", str(b.config_path), stdin="pw new\n").returncode == 0
    deadline = time.monotonic() + WAIT
    while logs_in(b, "late", "pw late"):
        assert time.monotonic() < deadline, "the old password still works"
        time.sleep(0.2)
    assert logs_in(b, "late", "pw new")
    assert user_cli("rm", "late", "--config", str(b.config_path)).returncode == 0
    deadline = time.monotonic() + WAIT
    while logs_in(b, "late", "pw new"):
        assert time.monotonic() < deadline, "a removed user still logs in"
        time.sleep(0.2)
    assert logs_in(b, "app", "secret")


def test_sighup_reloads_at_once_and_a_broken_file_keeps_the_users_as_they_were(broker_factory: Factory) -> None:
    b = secured(broker_factory, APP, security_invalidation_interval=600_000, login_failure_max_delay=100).start()
    r = user_cli("add", "early", "--users-file", str(users_path(b)), stdin="pw\n")
    assert r.returncode == 0, r.stderr
    assert not logs_in(b, "early", "pw"), "read again before the interval or a SIGHUP"
    b.signal(signal.SIGHUP)
    deadline = time.monotonic() + WAIT
    while not logs_in(b, "early", "pw"):
        assert time.monotonic() < deadline, f"SIGHUP did not reload the users file:\n{b.log_text()}"
        time.sleep(0.1)
    # A plain-text entry while running: logged, and the users stay as they were.
    good = users_path(b).read_text()
    users_path(b).write_text(good + '\n[users."eve"]\npassword = "plain"\n')
    b.signal(signal.SIGHUP)
    deadline = time.monotonic() + WAIT
    while "not reloaded" not in b.log_text():
        assert time.monotonic() < deadline, b.log_text()
        time.sleep(0.1)
    assert "'eve'" in b.log_text() and "plain\n" not in b.log_text()
    assert logs_in(b, "early", "pw") and logs_in(b, "app", "secret") and not logs_in(b, "eve", "plain")
    assert b.running


# ================================================================ nothing before the login


def test_packets_after_hello_wait_for_the_password_check(broker_factory: Factory, raws: Callable[..., Raw]) -> None:
    """HELLO and what follows in one write: after a wrong password none of it runs; after the right
    one, all of it, in order."""
    b = secured(broker_factory, APP).start()

    def burst(queue: str) -> bytes:
        return p.encode(p.CreateSession(1, 1)) + p.encode(p.Manage(0, 1, "queue.create", {"name": queue}))

    wrong = raws(b.port, False)
    wrong.send(hello("app", "wrong") + burst("q-wrong"))
    got = wrong.read(WAIT)
    assert wrong.eof and len(got) == 1 and got[0].code == ErrorCode.UNAUTHORIZED, got
    right = raws(b.port, False)
    right.send(hello("app", "secret") + burst("q-right"))
    got = right.read(WAIT, until=lambda got: len(got) >= 3)
    assert [type(x) for x in got] == [p.HelloOk, p.Response, p.Response], got
    with tandem.connect(url_with(b, "app", "secret")) as conn:
        names = {row["name"] for row in conn.manage("queue.stat")}
    assert "q-right" in names and "q-wrong" not in names, names


def test_frames_after_connect_wait_for_the_password_check(broker_factory: Factory, raws: Callable[..., Raw]) -> None:
    b = secured(broker_factory, APP).start()
    send = "SEND\ndestination:/queue/{q}\nreceipt:r1\n\nbody\0SUBSCRIBE\ndestination:/queue/{q}\nid:s\n\n\0"
    wrong = raws(b.ports["stomp"], True)
    wrong.send(connect_frame("app", "wrong") + send.replace("{q}", "s-wrong").encode())
    got = wrong.read(WAIT)
    assert wrong.eof and len(got) == 1 and is_error(got[0]), got
    right = raws(b.ports["stomp"], True)
    right.send(connect_frame("app", "secret") + send.replace("{q}", "s-right").encode())
    got = right.read(WAIT, until=lambda got: len(got) >= 3)
    assert [f.command for f in got] == ["CONNECTED", "RECEIPT", "MESSAGE"], got
    with tandem.connect(url_with(b, "app", "secret")) as conn:
        names = {row["name"] for row in conn.manage("queue.stat")}
    assert "s-right" in names and "s-wrong" not in names, names


# ============================================================ a failed-login burst


def test_a_failed_login_burst_does_not_slow_other_clients(broker_factory: Factory, raws: Callable[..., Raw]) -> None:
    """A peer (127.0.0.2) sends 60 wrong logins at once over native and STOMP. Its logins take
    turns, each after a growing delay, so the burst is far from answered when the other peer's
    (127.0.0.1) clients have logged in and been served — they did not queue behind it. (Users
    not logged in before: a login seen lately is remembered, and would not need a check.)"""
    fresh = {"n1": ("native pw", []), "s1": ("stomp pw", [])}
    b = secured(broker_factory, {**APP, **fresh}, log_level="warning").start()
    with tandem.connect(url_with(b, "app", "secret")) as before:
        attackers = []
        for i in range(30):
            n = raws(b.port, False, "127.0.0.2")
            n.send(hello(f"mallory{i}", f"guess{i}"))
            s = raws(b.ports["stomp"], True, "127.0.0.2")
            s.send(connect_frame(f"eve{i}", f"guess{i}"))
            attackers += [n, s]
        # Meanwhile, from the other peer: a connected client, and new logins over both protocols.
        assert before.manage("broker.status")["state"] == "active"
        assert logs_in(b, "n1", "native pw")
        ok = raws(b.ports["stomp"], True)
        ok.send(connect_frame("s1", "stomp pw"))
        assert ok.read(WAIT, until=bool)[0].command == "CONNECTED"
        answered = sum(a.answered() for a in attackers)
        assert answered < len(attackers) // 2, f"{answered} of the burst's logins answered before another peer's"
        assert before.manage("broker.status")["state"] == "active"
    # The burst's own answers: a refusal (or, for those still waiting, the handshake deadline).
    got = attackers[0].read(2 * WAIT)
    assert attackers[0].eof and len(got) == 1 and got[0].code == ErrorCode.UNAUTHORIZED, got
    log = b.log_text()
    assert "login failed for user" in log and "from 127.0.0.2:" in log and ("over native" in log or "over stomp" in log)
    assert "guess" not in log


def test_a_wrong_cluster_pair_in_cluster_announce_closes_and_slows_the_peer(
    broker_factory: Factory, raws: Callable[..., Raw]
) -> None:
    """Else a logged-in client could try cluster passwords on one connection as fast as it likes."""
    b = secured(broker_factory, APP, login_failure_delay=1500, log_level="warning").start()
    r = raws(b.port, False, "127.0.0.4")
    r.send(hello("app", "secret"))
    assert isinstance(r.read(WAIT, until=bool)[0], p.HelloOk)
    announce = {"user": "tandem.cluster", "password": "guess", "node_id": "x", "connector": "127.0.0.1:1"}
    r.send(p.encode(p.Manage(0, 1, "cluster.announce", announce)))
    got = r.read(WAIT)
    assert r.eof and got[-1].code == ErrorCode.UNAUTHORIZED, got
    again = raws(b.port, False, "127.0.0.4")
    t0 = time.monotonic()
    again.send(hello("app", "secret"))  # a login seen before: remembered, but this peer waits its turn
    assert isinstance(again.read(WAIT, until=bool)[0], p.HelloOk)
    assert time.monotonic() - t0 >= 1.4, "the peer's next login did not wait"
    assert "from 127.0.0.4:" in b.log_text() and "cluster.announce" in b.log_text() and "guess" not in b.log_text()


# ======================================================================= fuzz


@st.composite
def hellos(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A HELLO with fuzzed fields (sometimes the right pair), maybe junk after it; and whether it
    is the right pair with the right version."""
    right = draw(st.booleans())
    user = "app" if right else draw(st.one_of(st.none(), st.text(max_size=300), st.just("app")))
    password = "secret" if right else draw(st.one_of(st.none(), st.text(max_size=300), st.just("secret")))
    version = draw(st.sampled_from([p.PROTOCOL_VERSION, p.PROTOCOL_VERSION, 0, p.PROTOCOL_VERSION + 1, -1, 2**40]))
    pkt = p.Hello(
        version,
        client_id=draw(st.one_of(st.none(), st.text(max_size=50))),
        username=user,
        password=password,
        client_name=draw(st.text(max_size=50)),
        connection_ttl=draw(st.integers(-(2**40), 2**40)),
        confirmation_window=draw(st.integers(-(2**40), 2**40)),
        connection_id=draw(st.text(max_size=50)),
    )
    junk = draw(st.one_of(st.just(b""), st.binary(max_size=64)))
    ok = user == "app" and password == "secret" and version == p.PROTOCOL_VERSION
    return p.MAGIC + p.encode(pkt) + junk, ok


_VALUE = st.text(st.characters(blacklist_characters="\n\r:\0\\", blacklist_categories=("Cs",)), max_size=200)
_CREDENTIAL = _VALUE.map(str.strip)  # STOMP 1.0 may trim a header's value
_EXTRA = _VALUE.filter(lambda k: bool(k) and k.strip() not in ("login", "passcode", "accept-version"))


@st.composite
def connects(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A CONNECT (or STOMP) with fuzzed headers (sometimes the right pair, sometimes none), maybe
    junk after it; and whether the broker may accept it."""
    right = draw(st.booleans())
    login = "app" if right else draw(st.one_of(_CREDENTIAL, st.just("app")))
    passcode = "secret" if right else draw(st.one_of(_CREDENTIAL, st.just("secret")))
    headers = [
        ("accept-version", draw(st.sampled_from(["1.2", "1.1", "1.0", "1.2,1.1", "2.0", ""]))),
        ("host", draw(_VALUE)),
    ]
    with_credentials = draw(st.integers(0, 4)) > 0
    if with_credentials:
        headers += [("login", login), ("passcode", passcode)]
    extra = draw(st.lists(st.tuples(_EXTRA, _VALUE), max_size=3))
    command = draw(st.sampled_from(["CONNECT", "STOMP"]))
    head = command + "\n" + "".join(f"{k}:{v}\n" for k, v in [*headers, *extra]) + "\n"
    junk = draw(st.one_of(st.just(b""), st.binary(max_size=64)))
    version_ok = headers[0][1] != "2.0"
    ok = with_credentials and login == "app" and passcode == "secret" and version_ok
    return head.encode() + b"\0" + junk, ok


def test_fuzzed_logins_are_refused_clearly_and_only_the_right_pair_gets_in(
    broker_factory: Factory, raws: Callable[..., Raw]
) -> None:
    b = secured(broker_factory, APP, login_failure_delay=0).start()

    def first_answer(r: Raw) -> Any:
        got = r.read(3.0, until=bool)
        return got[0] if got else None

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=hellos())
    def native(case: tuple[bytes, bool]) -> None:
        data, ok = case
        r = raws(b.port, False)
        r.send(data)
        answer = first_answer(r)
        if isinstance(answer, p.HelloOk):
            assert ok, data
        elif ok:  # the right pair: only junk after it may be refused (or a part of a packet waited for)
            protocol = (ErrorCode.PROTOCOL, ErrorCode.FRAME_TOO_LARGE, ErrorCode.UNKNOWN_PACKET)
            assert answer is None or answer.code in protocol, (data, answer)
        else:
            assert isinstance(answer, p.Error) and "internal" not in answer.message, (data, answer)
        r.close()

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=connects())
    def stomp(case: tuple[bytes, bool]) -> None:
        data, ok = case
        r = raws(b.ports["stomp"], True)
        offered = data.split(b"\n")[1].decode().removeprefix("accept-version:")
        r.parser.version = negotiate(offered) or "1.0"  # what the broker answers in (1.0: no escapes)
        r.send(data)
        answer = first_answer(r)
        if isinstance(answer, Frame) and answer.command == "CONNECTED":
            assert ok, data
        elif answer is not None:
            assert is_error(answer) and "internal" not in answer.headers.get("message", ""), answer
        r.close()

    native()
    stomp()
    assert logs_in(b, "app", "secret") and b.running
    log = b.log_text()
    assert "internal error" not in log and "Traceback" not in log, log[-3000:]


# ================================================================ revocation


def test_removing_a_user_or_changing_it_closes_its_open_connections(broker_factory: Factory) -> None:
    """A reload that removes a user, or changes its roles or password, closes that user's open
    connections (native with an ERROR naming the reason, STOMP with an ERROR frame): what it was
    allowed when it logged in no longer holds. Other users' connections go on."""
    import stomp

    users = {**APP, "bob": ("bob-pw", ["app"]), "carol": ("carol-pw", ["app"]), "dave": ("dave-pw", ["app"])}
    b = secured(broker_factory, users, security_invalidation_interval=600_000).start()
    native = {u: tandem.connect(url_with(b, u, f"{u}-pw")) for u in ("bob", "carol", "dave")}
    try:
        for conn in native.values():
            assert conn.manage("broker.status")["state"] == "active"
        errors: list[str] = []

        class Listener(stomp.ConnectionListener):  # type: ignore[misc]
            def on_error(self, frame: Any) -> None:
                errors.append(frame.headers.get("message", ""))

        sc = stomp.Connection12([("127.0.0.1", b.ports["stomp"])], reconnect_attempts_max=1)
        sc.set_listener("l", Listener())
        sc.connect("bob", "bob-pw", wait=True)
        assert sc.is_connected()
        # bob removed, carol's roles changed, dave's password changed; app untouched
        write_users(
            users_path(b),
            {**APP, "carol": ("carol-pw", ["other"]), "dave": ("dave-new-pw", ["app"])},
        )
        b.signal(signal.SIGHUP)
        for user in ("bob", "carol", "dave"):
            deadline = time.monotonic() + WAIT
            while True:
                try:
                    native[user].manage("broker.status")
                except tandem.TandemError as exc:
                    assert "users file" in str(exc) or isinstance(exc, tandem.ConnectionLost), exc
                    break
                assert time.monotonic() < deadline, f"{user}'s connection is still open:\n{b.log_text()}"
                time.sleep(0.1)
        deadline = time.monotonic() + WAIT
        while sc.is_connected() or not errors:
            assert time.monotonic() < deadline, "bob's STOMP connection is still open"
            time.sleep(0.1)
        assert "bob" in errors[0] and "users file" in errors[0], errors
        assert "'bob'" in b.log_text() and "'carol'" in b.log_text() and "'dave'" in b.log_text()
        with tandem.connect(url_with(b, "app", "secret")) as conn:  # others go on
            assert conn.manage("broker.status")["connections"] == 1
        assert logs_in(b, "carol", "carol-pw") and logs_in(b, "dave", "dave-new-pw") and not logs_in(b, "bob", "bob-pw")
    finally:
        for conn in native.values():
            try:
                conn.close()
            except tandem.TandemError:
                pass
