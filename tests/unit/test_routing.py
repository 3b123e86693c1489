"""Address.route: the one-queue shortcut must route exactly as the general loop does."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tandem.core.address import Address
from tandem.core.message import Message, RoutingType

ANY, ANYCAST, MULTICAST = RoutingType.ANY, RoutingType.ANYCAST, RoutingType.MULTICAST


class _Filter:
    def __init__(self, accept: bool) -> None:
        self.accept = accept

    def matches(self, ref: object) -> bool:
        return self.accept


def _queue(name: str, rt: RoutingType, filt: _Filter | None = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, routing_type=rt, filter=filt)


def _message(rt: RoutingType) -> Message:
    return Message(1, "a", True, 4, 0, int(rt), None, None, b"")


# (queue routing type, message routing type) -> routed?
EXPECTED = {
    (ANYCAST, ANY): True,
    (ANYCAST, ANYCAST): True,
    (ANYCAST, MULTICAST): False,
    (MULTICAST, ANY): True,
    (MULTICAST, ANYCAST): False,
    (MULTICAST, MULTICAST): True,
}


@pytest.mark.parametrize(("queue_rt", "msg_rt"), list(EXPECTED))
@pytest.mark.parametrize("filt", [None, _Filter(True), _Filter(False)], ids=["no-filter", "accepts", "rejects"])
def test_one_queue(queue_rt: RoutingType, msg_rt: RoutingType, filt: _Filter | None) -> None:
    addr = Address(1, "a", {queue_rt})
    q = _queue("q", queue_rt, filt)
    addr.queues["q"] = q  # type: ignore[assignment]
    routed = EXPECTED[(queue_rt, msg_rt)] and (filt is None or filt.accept)
    assert addr.route(_message(msg_rt)) == ([q] if routed else [])


def test_two_queues_take_the_general_path() -> None:
    addr = Address(1, "a", {ANYCAST, MULTICAST})
    a1, a2, m1 = _queue("a1", ANYCAST), _queue("a2", ANYCAST), _queue("m1", MULTICAST)
    for q in (a1, a2, m1):
        addr.queues[q.name] = q  # type: ignore[assignment]
    first = addr.route(_message(ANY))
    second = addr.route(_message(ANY))
    assert first[0] is m1 and second[0] is m1  # every multicast queue gets a copy
    assert {first[1].name, second[1].name} == {"a1", "a2"}  # anycast queues take turns
    assert addr.route(_message(MULTICAST)) == [m1]
