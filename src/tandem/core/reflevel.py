"""One priority level of a queue: a FIFO of message references the garbage collector can skip.

A deque of a million references costs every full collection a million visits, one cache miss
each (~135 ms on a primary holding 1M messages: a held loop, so a gap in every confirmation).
Here the references wait in tuples of CHUNK: the references are untracked structs, so the
collector stops tracking each tuple at its first pass, and a full collection follows one
pointer per chunk instead of one per message. Only the head being consumed (a list, so a taken
slot is cleared at once and its message freed) and the tail being filled are tracked.

The order is the head from `_hi`, then the chunks, then the tail; the queue keeps each level in
sequence order, which `iter_after` relies on.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from operator import attrgetter
from typing import Any

from .message import MessageRef

CHUNK = 256
"""References per tuple: a full collection walks len/CHUNK chunks; a remove copies one chunk."""

_seq_of = attrgetter("seq")


def _last_seq(chunk: tuple[MessageRef, ...]) -> int:
    return chunk[-1].seq


class RefLevel:
    """The subset of deque's interface the queue uses, with the same results."""

    __slots__ = ("_head", "_hi", "_mid", "_n", "_tail")

    def __init__(self, items: Iterable[MessageRef] = ()) -> None:
        self._head: list[Any] = []  # being consumed: slots before _hi are cleared
        self._hi = 0
        self._mid: deque[tuple[MessageRef, ...]] = deque()
        self._tail: list[MessageRef] = []
        self._n = 0
        self.extend(items)

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[MessageRef]:
        return chain(islice(self._head, self._hi, None), chain.from_iterable(self._mid), self._tail)

    def __getitem__(self, i: int) -> MessageRef:
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("RefLevel index out of range")
        if i == n - 1 and self._tail:
            return self._tail[-1]
        head = len(self._head) - self._hi
        if i < head:
            ref: MessageRef = self._head[self._hi + i]
            return ref
        i -= head
        for chunk in self._mid:
            if i < len(chunk):
                return chunk[i]
            i -= len(chunk)
        return self._tail[i]

    def append(self, ref: MessageRef) -> None:
        tail = self._tail
        tail.append(ref)
        self._n += 1
        if len(tail) >= CHUNK:
            self._mid.append(tuple(tail))
            tail.clear()

    def extend(self, items: Iterable[MessageRef]) -> None:
        tail = self._tail
        before = len(tail)
        tail.extend(items)
        self._n += len(tail) - before
        if len(tail) >= CHUNK:
            full = len(tail) - len(tail) % CHUNK
            self._mid.extend(tuple(tail[k : k + CHUNK]) for k in range(0, full, CHUNK))
            del tail[:full]

    def popleft(self) -> MessageRef:
        head, i = self._head, self._hi
        if i >= len(head):
            head = self._next_head()
            i = 0
        ref: MessageRef = head[i]
        head[i] = None
        self._hi = i + 1
        self._n -= 1
        return ref

    def take(self, n: int) -> list[MessageRef]:
        """Pop up to `n` from the front in one call (fewer at the end of the head segment; empty
        when the level is): the dispatch loop's one call per batch instead of one per message."""
        head, i = self._head, self._hi
        if i >= len(head):
            if not self._n:
                return []
            head = self._next_head()
            i = 0
        j = min(len(head), i + n)
        out = head[i:j]
        head[i:j] = [None] * (j - i)
        self._hi = j
        self._n -= j - i
        return out

    def give_back(self, refs: list[MessageRef]) -> None:
        """Put back, in front and in order, the unused end of the last `take`."""
        k = len(refs)
        if not k:
            return
        head, i = self._head, self._hi - k
        if i >= 0 and all(x is None for x in head[i : self._hi]):
            head[i : self._hi] = refs
            self._hi = i
            self._n += k
        else:
            self.extendleft(reversed(refs))

    def _next_head(self) -> list[Any]:
        if self._mid:
            head: list[Any] = list(self._mid.popleft())
        elif self._tail:
            head, self._tail = self._tail, []
        else:
            self._head, self._hi = [], 0
            raise IndexError("pop from an empty RefLevel")
        self._head, self._hi = head, 0
        return head

    def extendleft(self, items: Iterable[MessageRef]) -> None:
        """As deque.extendleft: each item goes to the front in turn (so reversed order)."""
        front = list(items)
        if not front:
            return
        front.reverse()
        rest = self._head[self._hi :]
        if rest:
            self._mid.appendleft(tuple(rest))
        self._head, self._hi = front, 0
        self._n += len(front)

    def remove(self, ref: MessageRef) -> None:
        """Remove the first occurrence (by identity, as deque.remove for these refs); ValueError if none."""
        head = self._head
        for j in range(self._hi, len(head)):
            if head[j] is ref:
                del head[j]
                self._n -= 1
                return
        mid = self._mid
        for k, chunk in enumerate(mid):
            for j, r in enumerate(chunk):
                if r is ref:
                    rest = chunk[:j] + chunk[j + 1 :]
                    if rest:
                        mid[k] = rest
                    else:
                        del mid[k]
                    self._n -= 1
                    return
        for j, r in enumerate(self._tail):
            if r is ref:
                del self._tail[j]
                self._n -= 1
                return
        raise ValueError("RefLevel.remove(x): x not in level")

    def clear(self) -> None:
        self._head, self._hi = [], 0
        self._mid.clear()
        self._tail = []
        self._n = 0

    def iter_after(self, seq: int) -> Iterator[MessageRef]:
        """The references with a sequence above `seq`, in order (the level is in sequence order):
        a bisection, so a reader taking a long range in pieces pays for each piece only."""
        head, hi = self._head, self._hi
        if hi < len(head) and head[-1].seq > seq:
            j = bisect_right(head, seq, lo=hi, key=_seq_of)
            return chain(islice(head, j, None), chain.from_iterable(self._mid), self._tail)
        mid = self._mid
        k = bisect_right(mid, seq, key=_last_seq)
        if k < len(mid):
            chunk = mid[k]
            j = bisect_right(chunk, seq, key=_seq_of)
            return chain(islice(chunk, j, None), chain.from_iterable(islice(mid, k + 1, None)), self._tail)
        tail = self._tail
        return islice(tail, bisect_right(tail, seq, key=_seq_of), None)
