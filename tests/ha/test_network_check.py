"""`network-check-list`: TCP connection checks on loopback (a listening socket answers, a closed port does not)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from ha_pair import free_port
from tandem.config import load_config
from tandem.ha.network_check import NetworkCheck, parse_check_target


def test_an_empty_list_is_always_reachable() -> None:
    assert asyncio.run(NetworkCheck([], timeout=100).reachable())


def test_a_listening_port_is_reachable_and_a_closed_one_is_not() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        closed = free_port()
        assert asyncio.run(NetworkCheck([f"127.0.0.1:{port}"], timeout=1000).reachable())
        assert not asyncio.run(NetworkCheck([f"127.0.0.1:{closed}"], timeout=1000).reachable())
        assert asyncio.run(NetworkCheck([f"127.0.0.1:{closed}", f"127.0.0.1:{port}"], timeout=1000).reachable()), (
            "any one target answering is enough"
        )


def test_a_bare_host_counts_as_reachable_when_it_answers_at_all() -> None:
    """Without a port a refused connection is an answer: the host is up and the path to it works."""
    assert asyncio.run(NetworkCheck(["127.0.0.1"], timeout=1000).reachable())
    assert asyncio.run(NetworkCheck(["localhost"], timeout=1000).reachable())


def test_a_name_that_does_not_resolve_is_not_reachable() -> None:
    assert not asyncio.run(NetworkCheck(["no-such-host.invalid", "no-such-host.invalid:80"], timeout=1000).reachable())


def test_a_silent_target_is_given_up_after_the_timeout() -> None:
    """A listener whose backlog is full leaves new connections unanswered (SYNs dropped): no answer in time."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        try:
            for _ in range(8):  # fill the accept queue; later SYNs are dropped
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                fillers.append(s)
            check = NetworkCheck([f"127.0.0.1:{port}"], timeout=200)

            async def probe() -> bool:
                return await asyncio.wait_for(check.reachable(), 10)

            assert not asyncio.run(probe())
        finally:
            for s in fillers:
                s.close()


def test_the_monitor_reports_loss_and_return() -> None:
    port = free_port()

    async def main() -> list[bool]:
        seen: list[bool] = []
        changed = asyncio.Event()

        def on_change(ok: bool) -> None:
            seen.append(ok)
            changed.set()

        async def wait_change() -> None:
            await asyncio.wait_for(changed.wait(), 10)
            changed.clear()

        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)
        check = NetworkCheck([f"127.0.0.1:{port}"], timeout=500, period=50)
        task = asyncio.create_task(check.monitor(on_change))
        try:
            server.close()
            await server.wait_closed()
            await wait_change()
            server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)
            await wait_change()
        finally:
            task.cancel()
            server.close()
        return seen

    assert asyncio.run(main()) == [False, True], "only changes are reported, the first one being the loss"


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("10.0.0.1", ("10.0.0.1", None)),
        ("gw.local:22", ("gw.local", 22)),
        ("[::1]:61616", ("::1", 61616)),
        ("::1", ("::1", None)),
        ("fe80::1", ("fe80::1", None)),
    ],
)
def test_targets(text: str, target: tuple[str, int | None]) -> None:
    assert parse_check_target(text) == target


def test_from_config() -> None:
    cfg = load_config(None, network_check_list=["127.0.0.1:1"], network_check_period=700, network_check_timeout=300)
    check = NetworkCheck.from_config(cfg)
    assert (check.targets, check.period, check.timeout) == ([("127.0.0.1", 1)], 0.7, 0.3)
