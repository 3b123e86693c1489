"""Range reads on the client: a READ_RANGE answer and the large bodies that follow it.

A RANGE_RESULT names its large messages (index, stored size, compressed); their bodies come
next, in that order, as DELIVER_CHUNKs keyed by minus the READ_RANGE's command id, and land in
spooled temporary files (client/large.py) as a consumer's do. A read whose link failed before
its bodies were whole is simply asked again: a range read changes nothing on the broker.
"""

from __future__ import annotations

import asyncio

from ..errors import CallTimeout, ProtocolError, TandemError, Unblocked
from ..protocol import native as p
from .large import LargeBody

RANGE_READ_ATTEMPTS = 5  # a read interrupted by connection losses is asked again up to this many times in all
# The bulk form (`read_range_records`) gives each body as bytes in memory, up to this size.
RECORDS_BODY_LIMIT = 256 << 20


class RangeBodies:
    """The large bodies of one READ_RANGE's answer, as they arrive."""

    __slots__ = ("bodies", "current", "done", "losses", "received")

    def __init__(self, loop: asyncio.AbstractEventLoop, losses: int) -> None:
        self.bodies: list[tuple[int, int, LargeBody]] = []  # (index in the answer, message id, body)
        self.current = 0  # the body whose chunks come now
        self.done: asyncio.Future[None] = loop.create_future()
        self.losses = losses  # the connection's losses when the READ_RANGE was sent
        self.received = 0  # bytes of chunks received (progress, for the timeout)

    def answer(self, pkt: p.RangeResult, losses: int) -> None:
        """The RANGE_RESULT arrived (before any of its chunks)."""
        if self.done.done():
            return
        if pkt.large and losses != self.losses:
            # Answered after a reattach (kept by the server, sent again): the chunks that
            # followed it the first time were lost with the link and are not sent again.
            self.fail(Unblocked("the connection failed during a range read: its large bodies were lost"))
            return
        for i, size, compressed in pkt.large:
            if not 0 <= i < len(pkt.messages):
                raise ProtocolError(f"a range read's large message {i} is not in its answer")
            self.bodies.append((i, pkt.messages[i][1], LargeBody(size, compressed)))
        if not self.bodies:
            self.done.set_result(None)

    def chunk(self, pkt: p.DeliverChunk) -> None:
        if self.done.done():
            return  # given up (its link failed): what still comes of it is dropped
        if self.current >= len(self.bodies):
            raise ProtocolError(f"a chunk of message {pkt.message_id}, which this range read does not expect")
        _, mid, body = self.bodies[self.current]
        if mid != pkt.message_id:
            raise ProtocolError(f"a chunk of message {pkt.message_id} while message {mid}'s body is arriving")
        body.add(pkt.index, pkt.data, pkt.last)
        self.received += len(pkt.data)
        if pkt.last:
            self.current += 1
            if self.current == len(self.bodies):
                self.done.set_result(None)

    @property
    def waiting(self) -> bool:
        """Answered, with bodies still to come."""
        return bool(self.bodies) and not self.done.done()

    def fail(self, exc: TandemError) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
            self.done.exception()  # retrieved: the reader may have stopped waiting already
        self.close()

    def close(self) -> None:
        for _, _, body in self.bodies:
            body.close()

    async def wait(self, idle: float) -> dict[int, LargeBody]:
        """Until every body is whole (CallTimeout after `idle` seconds without a chunk); by index."""
        while not self.done.done():
            seen = self.received
            try:
                await asyncio.wait_for(asyncio.shield(self.done), idle)
            except TimeoutError:
                if self.received == seen:
                    raise CallTimeout(f"a range read's large body stopped arriving for {idle:.1f}s") from None
        self.done.result()  # raises what failed it
        return {i: body for i, _, body in self.bodies}
