"""The users file's format and hashes (tandem/users.py), the login delays (server/security.py)
and the password input of `tandem user`, without a broker."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem import users as u
from tandem.config import BrokerConfig
from tandem.errors import ConfigError
from tandem.server.security import ANONYMOUS, Authenticator, Subject, peer_host


def test_a_hash_carries_its_costs_and_checks_only_its_password() -> None:
    text = u.hash_password("pässwört", n=1024, r=4, p=2)
    assert text.startswith("scrypt$n=1024,r=4,p=2$"), text
    h = u.parse_hash(text)
    assert (h.n, h.r, h.p) == (1024, 4, 2) and str(h) == text
    assert h.matches("pässwört") and not h.matches("passwort") and not h.matches("")
    other = u.parse_hash(u.hash_password("pässwört", n=1024, r=4, p=2))
    assert other.salt != h.salt and other.digest != h.digest, "each hash has a salt of its own"
    assert u.parse_hash(u.hash_password("x")).n == u.DEFAULT_N


@pytest.mark.parametrize(
    "text",
    [
        "secret",
        "",
        "scrypt$n=16384,r=8,p=1$$",
        "scrypt$n=16383,r=8,p=1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==",  # not a power of two
        "scrypt$n=1048576,r=8,p=1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==",  # 1 GiB per check
        "scrypt$n=16384,r=0,p=1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==",
        "scrypt$n=16384,r=8,p=1$c2FsdA==$aGFzaGhhc2hoYXNoaGFzaA==",  # salt too short
        "ENC(1024:abcdef:123456)",
    ],
)
def test_what_is_not_a_usable_hash_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        u.parse_hash(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_a_hash_or_a_value_error(text: str) -> None:
    try:
        u.parse_hash(text)
    except ValueError:
        pass


NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(
    lambda n: all(ord(c) >= 32 and ord(c) != 127 for c in n)  # what check_name takes
)
ROLES = st.frozensets(NAMES.map(str.strip).filter(lambda r: bool(r) and "," not in r), max_size=3)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(NAMES, ROLES, max_size=4))
def test_the_file_reads_back_as_written(
    tmp_path_factory: pytest.TempPathFactory, entries: dict[str, frozenset[str]]
) -> None:
    path = tmp_path_factory.mktemp("users") / "users.toml"
    hashed = u.parse_hash(u.hash_password("pw", n=16, r=1, p=1))
    users = {name: u.User(name, hashed, roles) for name, roles in entries.items()}
    u.write_users(path, users)
    assert u.read_users(path) == users
    assert os.stat(path).st_mode & 0o077 == 0


def test_a_plain_text_password_is_refused_naming_the_user_and_not_echoed(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    ok = u.hash_password("x", n=16, r=1, p=1)
    path.write_text(f'[users."ok"]\npassword = "{ok}"\n[users."bob"]\npassword = "hunter2"\nroles = ["a"]\n')
    with pytest.raises(ConfigError) as info:
        u.read_users(path)
    msg = info.value.message
    assert "'bob'" in msg and "plain-text" in msg and "tandem user passwd bob" in msg and str(path) in msg, msg
    assert "hunter2" not in msg
    path.write_text('[users."bob"]\nroles = ["a"]\n')
    with pytest.raises(ConfigError, match="'bob' has no password"):
        u.read_users(path)
    path.write_text('[users."bob"]\npassword = "x"\nrole = ["typo"]\n')
    with pytest.raises(ConfigError, match="role"):
        u.read_users(path)


@pytest.mark.parametrize("name", ["", "a\nb", "tab\there", "del\x7f", "x" * 257])
def test_names_and_roles_that_the_file_could_not_hold_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        u.check_name(name)
    with pytest.raises(ValueError):
        u.check_role(name or " ")


def test_the_users_file_is_found_next_to_the_config(tmp_path: Path) -> None:
    assert u.resolve_users_file(None, tmp_path / "broker.toml") == tmp_path / "users.toml"
    assert u.resolve_users_file("etc/u.toml", tmp_path / "broker.toml") == tmp_path / "etc/u.toml"
    assert u.resolve_users_file("/abs/u.toml", tmp_path / "broker.toml") == Path("/abs/u.toml")
    assert u.resolve_users_file(None, None) == Path("users.toml")


# ----------------------------------------------------------------- the authenticator


def authenticator(tmp_path: Path, users: dict[str, tuple[str, list[str]]], **cfg: object) -> Authenticator:
    path = tmp_path / "users.toml"
    u.write_users(
        path, {n: u.User(n, u.parse_hash(u.hash_password(pw, n=1024)), frozenset(r)) for n, (pw, r) in users.items()}
    )
    config = BrokerConfig(security_enabled=True, cluster_password="pair", users_file=str(path), **cfg)  # type: ignore[arg-type]
    return Authenticator(config)


def test_a_check_gives_the_users_subject_and_roles(tmp_path: Path) -> None:
    auth = authenticator(tmp_path, {"app": ("pw", ["a", "b"])})

    async def main() -> None:
        assert await auth.check("app", "pw", "1.2.3.4:5") == Subject("app", frozenset({"a", "b"}))
        assert await auth.check("app", "wrong", "1.2.3.4:5") is None
        assert await auth.check(None, None, "1.2.3.4:5") is None
        assert await auth.check("tandem.cluster", "pair") == Subject("tandem.cluster", cluster=True)
        assert await auth.check("tandem.cluster", "wrong") is None

    asyncio.run(main())
    assert auth.subject_for("app") == Subject("app", frozenset({"a", "b"})) and auth.subject_for("nobody") is None
    auth.close()
    off = Authenticator(BrokerConfig())
    assert asyncio.run(off.check("anyone", "anything")) is ANONYMOUS


def test_a_peers_failed_logins_slow_its_next_ones_and_nobody_elses(tmp_path: Path) -> None:
    """After each failure the peer's next login waits twice as long (200, 400 ms...); a login
    from another address does not wait. (Lower bounds only: the delays are the feature.)"""
    auth = authenticator(tmp_path, {"app": ("pw", [])}, login_failure_delay=200, login_failure_max_delay=400)

    async def timed(user: str, password: str, peer: str) -> tuple[Subject | None, float]:
        t0 = time.monotonic()
        subject = await auth.check(user, password, peer)
        return subject, time.monotonic() - t0

    async def main() -> None:
        assert (await timed("app", "x", "10.0.0.1:1"))[0] is None
        subject, took = await timed("app", "pw", "10.0.0.1:2")  # the right password waits its turn too
        assert subject is not None and took >= 0.19, took
        assert (await timed("app", "x", "10.0.0.1:3"))[0] is None
        _, took = await timed("app", "x", "10.0.0.1:4")
        assert took >= 0.39, took  # capped at login-failure-max-delay... and still waited
        elsewhere, took = await timed("app", "pw", "10.0.0.2:1")
        assert elsewhere is not None
        # Three at once from the failing peer take turns, each after the (capped) delay.
        t0 = time.monotonic()
        await asyncio.gather(*(auth.check("app", "x", f"10.0.0.1:{i}") for i in range(3)))
        assert time.monotonic() - t0 >= 3 * 0.39

    asyncio.run(main())
    auth.close()


def test_guesses_at_the_cluster_password_are_slowed_like_any_other(tmp_path: Path) -> None:
    """Right or wrong, a guess from a peer with failures is answered only after its delay: the
    right cluster password among parallel guesses is not answered first."""
    auth = authenticator(tmp_path, {"app": ("pw", [])}, login_failure_delay=300, login_failure_max_delay=300)

    async def main() -> None:
        assert await auth.check("tandem.cluster", "guess", "10.0.0.6:1") is None
        t0 = time.monotonic()
        assert await auth.check("tandem.cluster", "pair", "10.0.0.6:2") == Subject("tandem.cluster", cluster=True)
        assert time.monotonic() - t0 >= 0.29, "the right cluster password skipped the peer's delay"

    asyncio.run(main())
    auth.close()


def test_a_check_cut_short_by_its_client_leaving_still_slows_the_peer(tmp_path: Path) -> None:
    """Closing the connection right after HELLO must not buy hash checks that cost the peer nothing."""
    auth = authenticator(tmp_path, {"app": ("pw", [])}, login_failure_delay=300, login_failure_max_delay=300)
    path = tmp_path / "users.toml"  # a costly hash (about 0.1 s): the check is still under way when cut short
    u.write_users(path, {"app": u.User("app", u.parse_hash(u.hash_password("pw", n=2**15)), frozenset())})
    assert auth.reload()

    async def main() -> None:
        task = asyncio.ensure_future(auth.check("app", "guess", "10.0.0.5:1"))
        await asyncio.sleep(0.001)  # the check is under way in a login thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        t0 = time.monotonic()
        assert await auth.check("app", "pw", "10.0.0.5:2") is not None
        assert time.monotonic() - t0 >= 0.29, "the next login did not wait"

    asyncio.run(main())
    auth.close()


def test_a_login_is_remembered_until_the_users_file_changes(tmp_path: Path) -> None:
    auth = authenticator(tmp_path, {"app": ("pw", ["a"])})
    path = tmp_path / "users.toml"

    async def main() -> None:
        assert await auth.check("app", "pw", "10.0.0.1:1") == Subject("app", frozenset({"a"}))
        new = u.User("app", u.parse_hash(u.hash_password("new", n=1024)), frozenset({"b"}))
        u.write_users(path, {"app": new})
        assert await auth.check("app", "pw", "10.0.0.9:1") is not None, "not read again before the interval"
        assert auth.reload()
        assert await auth.check("app", "pw", "10.0.0.9:2") is None, "a reload forgets what was remembered"
        assert await auth.check("app", "new", "10.0.0.1:2") == Subject("app", frozenset({"b"}))

    asyncio.run(main())
    auth.close()


def test_peer_host_drops_the_port() -> None:
    assert peer_host("10.0.0.1:5555") == "10.0.0.1"
    assert peer_host("::1:5555") == "::1"
    assert peer_host("?") == "?"


def test_a_reload_picks_up_changes_and_keeps_the_users_when_the_file_is_broken(tmp_path: Path) -> None:
    auth = authenticator(tmp_path, {"app": ("pw", [])})
    assert not auth.reload(), "unchanged: not read again"
    new = u.User("new", u.parse_hash(u.hash_password("pw", n=1024)), frozenset())
    u.write_users(tmp_path / "users.toml", {"new": new})
    assert auth.reload() and auth.subject_for("new") is not None and auth.subject_for("app") is None
    assert auth.take_changed() == {"app"} and auth.take_changed() == set(), "removed; taken once"
    (tmp_path / "users.toml").write_text('[users."new"]\npassword = "plain"\n')
    assert not auth.reload() and auth.subject_for("new") is not None
    assert auth.take_changed() == set(), "a file not taken changes nobody"
    (tmp_path / "users.toml").unlink()
    assert auth.reload() and auth.subject_for("new") is None
    assert auth.take_changed() == {"new"}


# -------------------------------------------------------------- tandem user (stdin)


def user_cli(tmp_path: Path, *args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tandem", "user", *args, "--users-file", str(tmp_path / "users.toml")],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("stdin", "ok"),
    [
        ("pw one\n", True),
        ("pw one\npw one\n", True),
        ("pw one", True),
        ("pw one\npw two\n", False),
        ("\n", False),
        ("", False),
        ("a\na\na\n", False),
    ],
)
def test_the_password_comes_from_stdin_once_or_twice_the_same(tmp_path: Path, stdin: str, ok: bool) -> None:
    r = user_cli(tmp_path, "add", "app", "--roles", "a, b", stdin=stdin)
    assert (r.returncode == 0) == ok, (r.returncode, r.stdout, r.stderr)
    if ok:
        users = u.read_users(tmp_path / "users.toml")
        assert users["app"].password.matches("pw one") and users["app"].roles == {"a", "b"}
        assert "pw one" not in r.stdout + r.stderr
    else:
        assert not (tmp_path / "users.toml").exists(), "a refused command wrote the file"


def test_add_refuses_an_existing_user_and_passwd_roles_rm_need_one(tmp_path: Path) -> None:
    assert user_cli(tmp_path, "add", "app", stdin="pw\n").returncode == 0
    r = user_cli(tmp_path, "add", "app", stdin="other\n")
    assert r.returncode != 0 and "exists" in r.stderr
    assert u.read_users(tmp_path / "users.toml")["app"].password.matches("pw")
    for args in (("passwd", "nobody"), ("roles", "nobody", "a"), ("rm", "nobody")):
        r = user_cli(tmp_path, *args, stdin="pw\n")
        assert r.returncode != 0 and "no user 'nobody'" in r.stderr, r.stderr
    assert user_cli(tmp_path, "roles", "app", "x,y", stdin="").returncode == 0
    assert user_cli(tmp_path, "passwd", "app", stdin="new\n").returncode == 0
    app = u.read_users(tmp_path / "users.toml")["app"]
    assert app.roles == {"x", "y"} and app.password.matches("new") and not app.password.matches("pw")
    assert user_cli(tmp_path, "rm", "app", stdin="").returncode == 0
    assert u.read_users(tmp_path / "users.toml") == {}
