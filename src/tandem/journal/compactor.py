"""Compaction: copy the live records of a prefix of the journal into fresh files.

Runs on its own thread (or in the CLI for a stopped broker). It works on a
*frozen prefix* of files that no longer receive appends, so it needs no lock:
an id counts as dead if the prefix itself deletes it; ids deleted later are
copied and die again when the later DELETE replays after them.

The swap is crash-safe: outputs are written under temporary names and
synced, then a marker file lists the renames and deletions; start-up
finishes a swap whose marker exists and discards outputs without one.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import files as jf
from . import records as rec
from .faults import Faults
from .storeio import StoreIO


@dataclass
class Output:
    key: int
    tmp: Path
    final: Path
    size: int
    ids: list[int] = field(default_factory=list)  # one entry per record written
    sizes: list[int] = field(default_factory=list)  # and its size (header and body): its live size
    used: int = jf.FILE_HEADER_SIZE


@dataclass
class Plan:
    frozen: list[tuple[int, Path, int]]  # (key, path, bytes used) in key order
    outputs: list[Output] = field(default_factory=list)
    dead: int = 0
    copied: int = 0


def marker_path(directory: Path, prefix: str) -> Path:
    return directory / f"{prefix}-compact.json"


def _frozen_files(frozen: list[tuple[int, Path, int]]) -> Iterator[tuple[bytes, list[rec.Parsed]]]:
    """Each frozen file's bytes and its records, parsed without copying simple records' payloads."""
    for key, path, used in frozen:
        with open(path, "rb") as fh:
            buf = fh.read(used)
        parsed: list[rec.Parsed] = []
        rec.scan(buf, jf.FILE_HEADER_SIZE, key, parsed, bodies=False)
        yield buf, parsed


def _last_deletes(frozen: list[tuple[int, Path, int]]) -> dict[int, int]:
    """id -> position (counting operations, a BATCH's members each) of its last DELETE."""
    dead_at: dict[int, int] = {}
    i = 0
    for _buf, parsed in _frozen_files(frozen):
        for p in parsed:
            kind = p[2]
            if kind == rec.BATCH or kind == rec.DELETES:
                for op in rec.iter_ops(p):
                    if op.kind == rec.DELETE:
                        dead_at[op.id] = i
                    i += 1
            else:
                if kind == rec.DELETE:
                    dead_at[p[4]] = i
                i += 1
    return dead_at


def _live_ops(frozen: list[tuple[int, Path, int]], dead_at: dict[int, int], plan: Plan) -> Iterator[rec.Op]:
    """The operations still live, in order (counting the others in `plan.dead`): an id's
    records before its last DELETE are dead, any after it (an id added again) are live.
    Only live payloads are copied out of the files."""
    i = 0
    for buf, parsed in _frozen_files(frozen):
        for p in parsed:
            off, length, kind, utype, rid, _body = p
            if kind == rec.BATCH or kind == rec.DELETES:
                for op in rec.iter_ops(p):
                    if op.kind == rec.DELETE or dead_at.get(op.id, -1) > i:
                        plan.dead += 1
                    else:
                        yield op
                    i += 1
            else:
                if kind == rec.DELETE or dead_at.get(rid, -1) > i:
                    plan.dead += 1
                else:
                    yield rec.Op(kind, utype, rid, buf[off + rec.HEADER_SIZE : off + length])
                i += 1


def run(
    directory: Path,
    prefix: str,
    file_size: int,
    plan: Plan,
    stop: threading.Event | None = None,
    faults: Faults | None = None,
    io: StoreIO | None = None,
) -> bool:
    """Write the live records of the frozen files; False if stopped before the end.

    Each output is handed to `io`'s tap (a replicating primary) as soon as it is complete."""
    io = io or StoreIO(directory)
    dead_at = _last_deletes(plan.frozen)
    last_key = plan.frozen[-1][0]
    out: Output | None = None
    fd = -1
    chunks: list[bytes] = []

    def finish() -> None:
        nonlocal fd, chunks
        if out is None:
            return
        chunks.append(rec.encode(out.key, rec.EOF, 0, 0))  # complete: a follower moves on at the marker
        if faults is not None:
            faults.hit("compact")
        io.write(fd, out.tmp.name, b"".join(chunks), jf.FILE_HEADER_SIZE)
        os.fsync(fd)
        os.close(fd)
        io.flush()
        fd = -1
        chunks = []

    n = 0
    for op in _live_ops(plan.frozen, dead_at, plan):
        n += 1
        if stop is not None and n % 4096 == 0 and stop.is_set():
            finish()
            return False
        size = rec.HEADER_SIZE + len(op.body)
        if out is None or out.used + size + rec.EOF_SIZE > out.size:
            finish()
            key = last_key + len(plan.outputs) + 1
            fsize = max(file_size, jf.FILE_HEADER_SIZE + size + rec.EOF_SIZE)
            out = Output(
                key,
                directory / f"{prefix}-cmp-{key:016x}.tmp",
                directory / jf.data_name(prefix, key),
                fsize,
            )
            plan.outputs.append(out)
            io.create(out.tmp.name, fsize, key)
            fd = io.open(out.tmp.name)
        chunks.append(rec.encode(out.key, op.kind, op.user_type, op.id, op.body))
        out.used += size
        out.ids.append(op.id)
        out.sizes.append(size)
        plan.copied += 1
    finish()
    return True


def write_marker(directory: Path, prefix: str, plan: Plan, io: StoreIO | None = None) -> None:
    marker = {
        "rename": [[o.tmp.name, o.final.name] for o in plan.outputs],
        "delete": [p.name for _k, p, _u in plan.frozen],
    }
    io = io or StoreIO(directory)
    io.put(marker_path(directory, prefix).name, json.dumps(marker).encode())
    io.sync_dir()


def apply_marker(directory: Path, prefix: str, io: StoreIO | None = None) -> bool:
    """Finish (or clean up after) a compaction interrupted by a crash; True if one was finished."""
    io = io or StoreIO(directory)
    marker = marker_path(directory, prefix)
    finished = False
    if marker.exists():
        spec = json.loads(marker.read_text())
        for name in spec["delete"]:
            if (directory / name).exists():
                io.unlink(name)
        for tmp, final in spec["rename"]:
            if (directory / tmp).exists():
                io.rename(tmp, final)
        io.sync_dir()
        io.unlink(marker.name)
        finished = True
    for stale in directory.glob(f"{prefix}-cmp-*.tmp"):
        io.unlink(stale.name, missing_ok=True)
    stale_marker = marker.with_suffix(".tmp")
    if stale_marker.exists():
        io.unlink(stale_marker.name, missing_ok=True)
    io.sync_dir()
    return finished


def swap(directory: Path, prefix: str, plan: Plan, faults: Faults | None = None, io: StoreIO | None = None) -> None:
    """Make the outputs replace the frozen files (blocking; writer thread or CLI)."""
    if faults is not None:
        faults.hit("rename")
    write_marker(directory, prefix, plan, io)
    apply_marker(directory, prefix, io)
