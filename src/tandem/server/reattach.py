"""What the server keeps so a client can reattach to its sessions after its socket failed.

With a confirmation window (HELLO's `confirmation_window` > 0) a connection's sessions
outlive its socket until the connection TTL expires. Per channel the server keeps the last
command id it has received (the client replays what comes after it) and its latest answers
(the client may have lost them on the wire); per consumer, how many deliveries it sent and
how much credit the client granted, so deliveries lost on the wire go back to the queue
without counting as a failed delivery and lost FLOWs are made good.
See docs/decisions/0038-session-reattachment.md.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.consumer import Consumer

# Answers kept per channel. Only answers sent after the last byte the client received can be
# lost, and those belong to calls and pipelined commands in flight at the failure: the
# client's windows (send_window per producer, one call per caller) bound them.
REPLIES_KEPT = 4096
REPLY_BYTES_KEPT = 4 << 20  # and at most about this much (a range read's answer holds messages)
REPLY_SIZE = 64  # an answer's size, for that count, besides the messages it carries
CLOSED_REPLIES_KEPT = 4  # a closed session's: its CLOSE_SESSION answer may still be awaited
CLOSED_CHANNELS_KEPT = 256  # closed sessions whose last command id is remembered
SERVER_CLOSED_KEPT = 64  # consumers the server closed (queue deleted), per session: told again on a reattach
SEND_OVERHEAD = 24  # bytes a SEND adds to its message, for the window's count
COMMAND_SIZE = 48  # a typical command other than SEND


class ChannelReplay:
    """One channel of a reattachable connection: the last command id received, the bytes
    received since the last RECEIVED, and the latest answers by command id."""

    __slots__ = ("dropped_upto", "kept_bytes", "last_cmd", "replies", "unconfirmed")

    def __init__(self) -> None:
        self.last_cmd = 0
        self.unconfirmed = 0
        self.replies: OrderedDict[int, Any] = OrderedDict()
        self.dropped_upto = -1  # the highest command id whose answer was let go (-1: none)
        self.kept_bytes = 0

    def keep(self, cmd: int, packet: Any, limit: int = REPLIES_KEPT, byte_limit: int = REPLY_BYTES_KEPT) -> None:
        replies = self.replies
        old = replies.pop(cmd, None)
        if old is not None:
            self.kept_bytes -= _size(old)
        replies[cmd] = packet
        self.kept_bytes += _size(packet)
        while len(replies) > limit or (self.kept_bytes > byte_limit and len(replies) > 1):
            dropped, pkt = replies.popitem(last=False)
            self.kept_bytes -= _size(pkt)
            self.dropped_upto = max(self.dropped_upto, dropped)

    def drop_oldest(self) -> None:
        dropped, pkt = self.replies.popitem(last=False)
        self.kept_bytes -= _size(pkt)
        self.dropped_upto = max(self.dropped_upto, dropped)

    def can_answer_from(self, cmd: int) -> bool:
        """Every answer to a command from `cmd` on is still kept (or was never sent): a client
        waiting for them loses none. Else a reattach could confirm a refused SEND as stored."""
        return cmd < 0 or self.dropped_upto < cmd

    def replies_from(self, cmd: int) -> list[Any]:
        return [pkt for c, pkt in self.replies.items() if c >= cmd]


def _size(packet: Any) -> int:
    messages = getattr(packet, "messages", None)  # RANGE_RESULT: [seq, id, count, message]
    return REPLY_SIZE + (sum(len(m[3]) for m in messages) if messages else 0)


def take_lost_deliveries(consumer: Consumer, lost: int) -> list[Any]:
    """The last `lost` deliveries of `consumer` (never received by the client), out of its
    unacknowledged ones, with the credit they took given back."""
    d = consumer.delivering
    n = min(lost, len(d))
    if n <= 0:
        return []
    refs = list(d.values())[-n:]
    consumer.sent -= n  # (counted again as they are sent again)
    size = 0
    for ref in refs:
        del d[ref.message.id]
        size += len(ref.message.raw)
    consumer.delivered_bytes -= size
    if consumer.account is not None:
        consumer.account.released(n, size)
    if consumer.window >= 0:
        consumer.credits += n if consumer.message_mode else size
    return refs


def trim_closed(replay: dict[int, ChannelReplay], open_channels: Any) -> None:
    """Forget the oldest closed channels beyond CLOSED_CHANNELS_KEPT (channel 0 stays)."""
    closed = [ch for ch in replay if ch and ch not in open_channels]
    for ch in sorted(closed)[: max(0, len(closed) - CLOSED_CHANNELS_KEPT)]:
        del replay[ch]
