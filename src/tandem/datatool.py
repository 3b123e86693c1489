"""`tandem data print|compact|repair`: look inside, compact or repair a stopped broker's data directory."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import msgspec

from .errors import IllegalState, InvalidArgument
from .ha.lockfile import LockFile
from .journal import Journal, JournalSettings
from .journal import files as jf
from .journal import records as rec
from .store.pages import decode_page, is_tx_page_name, page_key, parse_page_name
from .store.records import AddressRecord, MessageRecord, PageAckRecord, PageCursorRecord, QueueRecord, RecordType

_NAMES = {int(t): t.name for t in RecordType}


def _file_size(directory: Path, prefix: str, default: int) -> int:
    """The segment size the broker used: the most common size among its files."""
    sizes = Counter(p.stat().st_size for p in directory.glob(f"{prefix}-*.tj"))
    return sizes.most_common(1)[0][0] if sizes else default


def _journals(data: Path) -> list[tuple[str, Journal]]:
    if not (data / "journal").is_dir() and not (data / "bindings").is_dir():
        raise InvalidArgument(f"{data} is not a Tandem data directory (no journal/ or bindings/ inside)")
    out = []
    for label, sub, prefix in (("bindings", "bindings", "tandem-bindings"), ("messages", "journal", "tandem-data")):
        d = data / sub
        settings = JournalSettings(file_size=_file_size(d, prefix, JournalSettings.file_size))
        out.append((label, Journal(d, prefix, settings)))
    return out


def _raw_counts(j: Journal) -> Counter[str]:
    """Count every record on disk by kind and type (live or not)."""
    counts: Counter[str] = Counter()
    for f in j.file_summaries():
        with open(f.path, "rb") as fh:
            buf = fh.read()
        parsed: list[rec.Parsed] = []
        rec.scan(buf, jf.FILE_HEADER_SIZE, f.key, parsed)
        for p in parsed:
            for op in rec.iter_ops(p):
                kind = rec.Kind(op.kind).name
                if op.kind == rec.DELETE:
                    counts[kind] += 1
                else:
                    counts[f"{kind} {_NAMES.get(op.user_type, op.user_type)}"] += 1
            if p[2] == rec.BATCH:
                counts["BATCH records"] += 1
    return counts


def print_data(directory: str, records: bool, out: IO[str]) -> int:
    data = Path(directory)
    queues: dict[int, str] = {}
    addresses: dict[int, str] = {}
    cursors: dict[int, tuple[int, int]] = {}
    page_txs: set[int] = set()
    page_acks: set[tuple[int, int, int]] = set()  # (queue id, page, index): PAGE_ACK records
    per_queue: Counter[str] = Counter()
    large: dict[str, tuple[int, int]] = {}  # large body file -> (the record naming it, its recorded size)
    for label, j in _journals(data):
        live = j.load(readonly=True)
        st = j.stats()
        print(f"== {label} journal ({j.directory})", file=out)
        print(
            f"   files {st.files} (+{st.free_files} free), records {st.records}, live {st.live_records}, "
            f"live ids {st.live_ids}, live bytes {st.live_bytes} of {st.used_bytes}",
            file=out,
        )
        for f in j.file_summaries():
            print(
                f"   {f.path.name}  size {f.size}  used {f.used}  records {f.records}  live {f.live}  "
                f"live bytes {f.live_bytes}",
                file=out,
            )
        for c in st.corrupt:
            print(f"   CORRUPT {c} (the broker will not start: see `tandem data repair`)", file=out)
        for t in j.torn_tails:
            print(f"   torn tail (repaired on next start): {t}", file=out)
        for name, n in sorted(_raw_counts(j).items()):
            print(f"   {name:28} {n}", file=out)
        for rid, lr in live.items():
            utype = lr.user_type
            if utype == RecordType.QUEUE:
                q = msgspec.msgpack.decode(lr.body, type=QueueRecord)
                queues[rid] = q.name
                if records:
                    print(
                        f"   queue {rid}: {q.name!r} address={q.address!r} routing={q.routing_type} "
                        f"filter={q.filter!r}",
                        file=out,
                    )
            elif utype == RecordType.ADDRESS:
                body = lr.updates[-1][1] if lr.updates else lr.body
                a = msgspec.msgpack.decode(body, type=AddressRecord)
                addresses[rid] = a.name
                if records:
                    print(f"   address {rid}: {a.name!r} routing={a.routing_types}", file=out)
            elif utype == RecordType.PAGE_CURSOR:
                cur = msgspec.msgpack.decode(lr.body, type=PageCursorRecord)
                cursors[cur.queue_id] = (cur.page, cur.index)
            elif utype == RecordType.PAGE_ACK:
                pa = msgspec.msgpack.decode(lr.body, type=PageAckRecord)
                if not pa.end_page:  # (a purged span: its records still count here)
                    page_acks.add((pa.queue_id, pa.page, pa.index))
                    page_acks.update((pa.queue_id, page, index) for page, index in pa.more)
            elif utype == RecordType.PAGE_TX:
                page_txs.add(rid)
                if records:
                    print(f"   page transaction {rid} (committed)", file=out)
            elif utype == RecordType.MESSAGE:
                m = msgspec.msgpack.decode(lr.body, type=MessageRecord)
                acked = {msgspec.msgpack.decode(b, type=list)[0] for t, b in (lr.updates or ()) if t == RecordType.ACK}
                if m.large is not None:
                    large[m.large.file] = (rid, m.large.size)
                for qid, _seq in m.refs:
                    if qid not in acked:
                        per_queue[queues.get(qid, f"#{qid}")] += 1
                if records:
                    print(
                        f"   message {rid}: refs={m.refs} size={len(m.message)} updates={len(lr.updates or ())}"
                        + (f" large={m.large.file}:{m.large.size}" if m.large is not None else ""),
                        file=out,
                    )
    _print_paging(data, addresses, queues, cursors, page_txs, per_queue, records, out, page_acks)
    _print_large(data, large, out)
    print("== messages per queue", file=out)
    for name in sorted(set(queues.values()) | set(per_queue)):
        print(f"   {name:28} {per_queue.get(name, 0)}", file=out)
    return 0


def _print_paging(
    data: Path,
    addresses: dict[int, str],
    queues: dict[int, str],
    cursors: dict[int, tuple[int, int]],
    page_txs: set[int],
    per_queue: Counter[str],
    records: bool,
    out: IO[str],
    page_acks: set[tuple[int, int, int]] | None = None,
) -> None:
    """Page files per address with their records, and each queue's cursor (where it reads next).
    Messages still ahead of a cursor count in "messages per queue", those of a page transaction
    with no PAGE_TX record (cut by a crash before its commit, decision 0049) do not, nor those a
    queue acknowledged ahead of its cursor (PAGE_ACK: read back and acknowledged, decision 0063, or
    moved away by an operator without being read back, decision 0066)."""
    page_acks = page_acks or set()
    directory = data / "paging"
    print(f"== paging ({directory})", file=out)
    pages: dict[int, list[tuple[int, Path]]] = {}
    if directory.is_dir():
        for p in directory.iterdir():
            parsed = parse_page_name(p.name)
            if parsed is not None:
                pages.setdefault(parsed[0], []).append((parsed[1], p))
    for qid, (page, idx) in sorted(cursors.items()):
        ahead = sum(1 for a in page_acks if a[0] == qid)
        print(f"   cursor {queues.get(qid, f'#{qid}')}: page {page} message {idx}  acked ahead {ahead}", file=out)
    for aid in sorted(pages):
        print(f"   address {addresses.get(aid, f'#{aid} (deleted)')!r}:", file=out)
        for page, path in sorted(pages[aid]):
            buf = path.read_bytes()
            recs, end, reason = decode_page(buf, page_key(buf, page))
            tail = "" if end == len(buf) else f"  (records end at {end}: {reason})"
            print(f"   {path.name}  size {len(buf)}  messages {len(recs)}{tail}", file=out)
            for i, r in enumerate(recs):
                dead = bool(r.tx) and r.tx not in page_txs
                for qid, _seq in r.refs:
                    c = cursors.get(qid)
                    acked = (qid, page, i) in page_acks
                    if not dead and not acked and qid in queues and (c is None or (page, i) >= c):
                        per_queue[queues[qid]] += 1
                if records:
                    tx = f" tx={r.tx}" + (" (never committed)" if dead else "") if r.tx else ""
                    print(f"   paged message {r.mid}: refs={r.refs} size={len(r.raw)}{tx}", file=out)
    open_tx = sorted(p for p in directory.iterdir() if is_tx_page_name(p.name)) if directory.is_dir() else []
    for path in open_tx:  # decision 0055: refs in them (and in pages they became) count 1, 2, ... per queue
        print(
            f"   {path.name}  size {path.stat().st_size}  an open transaction's sends (removed at the next start)",
            file=out,
        )


def _print_large(data: Path, named: dict[str, tuple[int, int]], out: IO[str]) -> None:
    """The files of large-messages/: each with the record naming it, or what the next start does with it."""
    directory = data / "large-messages"
    print(f"== large messages ({directory})", file=out)
    present = sorted(p for p in directory.iterdir() if p.is_file()) if directory.is_dir() else []
    for path in present:
        size = path.stat().st_size
        rec = named.get(path.name)
        if rec is None:
            print(f"   {path.name}  size {size}  no record names it (removed at the next start)", file=out)
        elif rec[1] != size:
            print(
                f"   {path.name}  size {size}  message {rec[0]} records {rec[1]} bytes: "
                "not whole (the message is dropped at the next start)",
                file=out,
            )
        else:
            print(f"   {path.name}  size {size}  message {rec[0]}", file=out)
    names = {p.name for p in present}
    for name, (rid, size) in sorted(named.items()):
        if name not in names:
            print(f"   {name}  MISSING  message {rid} records {size} bytes (dropped at the next start)", file=out)


def repair_data(directory: str, out: IO[str]) -> int:
    """Cut damaged journal files at the damage (a copy of each kept under `damaged/`), repair torn tails."""
    data = Path(directory)
    with _stopped(data, "repairing"):
        for label, j in _journals(data):
            j.load(repair=True)
            for c in j.corrupt:
                print(f"{label}: damaged {c}: cut there, copy kept in {j.directory / 'damaged'}", file=out)
            for t in j.torn_tails:
                print(f"{label}: torn tail {t}: truncated", file=out)
            if not j.corrupt and not j.torn_tails:
                print(f"{label}: nothing to repair", file=out)
    return 0


@contextmanager
def _stopped(data: Path, doing: str) -> Iterator[None]:
    """Hold the store's live lock (when it has a lock file) so no broker starts meanwhile."""
    lock = LockFile(data) if (data / "server.lock").exists() else None
    try:
        if lock is not None and not lock.try_lock_live():
            raise IllegalState(f"a broker is running on {data}: stop it before {doing}")
        yield
    finally:
        if lock is not None:
            lock.close()


def compact_data(directory: str, out: IO[str]) -> int:
    data = Path(directory)
    with _stopped(data, "compacting"):
        for label, j in _journals(data):
            j.load()
            before = j.stats()
            plan = j.compact_offline()
            print(
                f"{label}: {before.files} files, {before.records} records → {len(plan.outputs)} files, "
                f"{plan.copied} live records kept, {plan.dead} dropped",
                file=out,
            )
    return 0
