"""A replicating backup's side: connect to the primary, take its store file by file, then follow.

The backup logs in with the cluster pair and asks to replicate (REPLICA_START). Once the primary
takes it on, its own store directories are moved aside (`oldreplica.N`, see `prepare`) and every
file operation of the stream is applied to its data directory in order, on one thread, by
journal/storeio.py's `Applier`: the directory becomes the primary's, byte for byte. Each round of
operations applied is synced (during the sync always; after it with `backup-fsync`, the
primary's setting) and acknowledged with the highest position it held. When the primary says the
sync is done (REPLICA_SYNC_DONE), and everything up to there is on disk, it answers
REPLICA_SYNCED: from then on it is in sync, may take over, and its broker
follows the directory like a shared-store backup does (store/follower.py), so taking over reads
only the tail.

A disk error while applying (an OSError: EIO, ENOSPC, a failed fsync) is not acknowledged and
ends the link; the activation then stops the server as a journal's disk error does (decision
0037), instead of syncing again onto a disk that fails.

The connection ends one of three ways, each an `Outcome`: the primary stopped or died while this
backup was in sync (take over), the primary dropped this backup or the sync did not finish
(start again from scratch), or the primary refused it (try again later).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from ..client.options import ConnectOptions
from ..client.tls import client_context
from ..config import BrokerConfig, split_connector
from ..errors import InvalidArgument, ProtocolError, error_for
from ..journal import files as jf
from ..journal.storeio import Applier, ReplicaError
from ..protocol import native as p
from ..protocol.fileops import COPY, KINDS
from ..store.records import STORE_FORMAT
from .tls_link import open_tls_link

log = logging.getLogger("tandem.ha")

RECV_SIZE = 1 << 20  # bytes read at once: what arrived during the last sync is applied and synced as one round
SYNCING_MARK = "replica.syncing"  # in a data directory whose copy is not complete: never worth keeping
_OLD = re.compile(r"^oldreplica\.(\d+)$")


class Outcome(enum.Enum):
    TAKE_OVER = "take-over"  # the primary is gone and this backup was in sync
    RESYNC = "resync"  # start again (dropped, or the sync did not complete)
    RETRY = "retry"  # no primary took us (not reachable, refused)


def prepare(root: Path, keep: int) -> Path | None:
    """Before a sync: move the store's directories aside to a new `oldreplica.N` (a half-done copy
    is removed instead), keep at most `keep` of them (-1: all; 0: none), and mark the directory
    as being synced. Returns where the old data went, if anywhere."""
    present = [root / d for d in KINDS if (root / d).is_dir() and any((root / d).iterdir())]
    partial = (root / SYNCING_MARK).exists()
    moved: Path | None = None
    if present and not partial and keep != 0:
        numbers = [int(m.group(1)) for x in root.iterdir() if (m := _OLD.match(x.name))]
        moved = root / f"oldreplica.{max(numbers, default=0) + 1}"
        moved.mkdir()
        for d in present:
            os.rename(d, moved / d.name)
        jf.fsync_dir(moved)
    for kind in KINDS:
        if (root / kind).exists():
            shutil.rmtree(root / kind)
    if keep >= 0:
        old = sorted((int(m.group(1)), x) for x in root.iterdir() if (m := _OLD.match(x.name)))
        for _n, path in old[: max(len(old) - keep, 0)]:
            shutil.rmtree(path)
    fd = os.open(root / SYNCING_MARK, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    jf.fsync_dir(root)
    return moved


class Replica:
    """One attempt at replicating the primary at `url` (host:port).

    The link is a blocking socket owned by one thread ("replica-link") that reads the stream,
    applies it, syncs and acknowledges, and answers pings: nothing of the stream's path goes
    through the event loop, which the warm follower keeps busy (decision 0042). The loop hears
    only of what it acts on (acceptance, sync progress, the end), in order, by
    `call_soon_threadsafe`.
    """

    def __init__(
        self,
        cfg: BrokerConfig,
        connector: str,
        adopt_node_id: Callable[[str], None],
        in_sync: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        self.cfg = cfg
        self.root = cfg.data_path
        self.connector = connector
        self._adopt = adopt_node_id
        self._in_sync_cb = in_sync
        self.loop = asyncio.get_running_loop()
        self.peer = ""
        self.state = "connecting"
        self.synced = False
        self.accepted = False
        self.total = 0
        self.copied = 0
        self.fsync = True
        self.primary_sequence = -1  # the activation sequence the primary took us on with (-1: none)
        self.stop_failover: bool | None = None  # what the primary's REPLICA_STOP said, if it said
        self.result: asyncio.Future[tuple[Outcome, str]] = self.loop.create_future()
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._closing = False  # run() ends the link: the thread's socket errors say nothing
        self._thread: threading.Thread | None = None
        self._relay: asyncio.Task[None] | None = None  # a TLS link's relay (ha/tls_link.py)
        self._applier = Applier(self.root)
        self.moved: Path | None = None
        self.apply_error: str | None = None
        self.disk_error: OSError | None = None  # this server's disk failed: it stops (not a resync)
        self._follow: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- run
    async def run(self, url: str) -> tuple[Outcome, str]:
        """Replicate until the link ends; the outcome, and why."""
        cfg = self.cfg
        host, port, tls = split_connector(url)
        self.peer = url
        timeout = cfg.initial_replication_sync_timeout / 1000
        try:
            if tls:  # the connector says tcps://: the link goes through a TLS relay (ha/tls_link.py)
                ctx = client_context(ConnectOptions(**cfg.link_options(url)))  # type: ignore[arg-type]
                sock, self._relay = await open_tls_link(host, port, ctx, timeout)
            else:
                sock = await asyncio.to_thread(socket.create_connection, (host, port), timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, InvalidArgument) as exc:  # TimeoutError and TLS failures included
            return Outcome.RETRY, f"cannot connect to {url}: {exc}"
        sock.settimeout(max(cfg.connection_ttl / 4000, 0.05))  # the link thread pings at this pace
        self._sock = sock
        self._send_raw(
            p.MAGIC
            + p.encode(
                p.Hello(
                    p.PROTOCOL_VERSION,
                    None,
                    cfg.cluster_user,
                    cfg.cluster_password,
                    "tandem-backup",
                    cfg.connection_ttl,
                )
            )
            + p.encode(
                p.ReplicaStart(cfg.cluster_user, cfg.cluster_password, self.connector, cfg.group_name, STORE_FORMAT)
            )
        )
        self._thread = threading.Thread(target=self._link, name="replica-link", daemon=True)
        self._thread.start()
        try:
            outcome, why = await self.result
        finally:
            await self._stop_thread()
            if self._follow is not None:  # the broker has started following before it hears the outcome
                await asyncio.wait([self._follow])
        if outcome is Outcome.TAKE_OVER and self.apply_error is not None:
            return Outcome.RESYNC, self.apply_error  # the replica may be short of what it acknowledged
        return outcome, why

    def _send(self, pkt: p.Packet) -> None:
        self._send_raw(p.encode(pkt))

    def _send_raw(self, data: bytes | bytearray) -> None:
        """(Any thread) a whole frame, or nothing: a failed send ends the link, which the link
        thread sees as it reads."""
        sock = self._sock
        if sock is None:
            return
        with self._send_lock:
            try:
                sock.sendall(data)
            except OSError:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(fn, *args)

    # ------------------------------------------------------------ link thread
    def _link(self) -> None:
        """Read, apply, sync, acknowledge, until the link ends; what is kept is a prefix of the stream."""
        sock = self._sock
        assert sock is not None
        reader = p.FrameReader(p.ServerPacket, self.cfg.max_frame_size, expect_magic=False)
        ttl = self.cfg.connection_ttl / 1000
        pace = max(ttl / 4, 0.05)
        now = time.monotonic()
        last_received = last_ping = now
        copying = True  # until REPLICA_SYNC_DONE: every round is synced, whatever backup-fsync says
        why = ""
        try:
            while True:
                try:
                    data = sock.recv(RECV_SIZE)
                except TimeoutError:
                    data = None
                except OSError as exc:
                    why = f"connection lost: {exc}"
                    break
                now = time.monotonic()
                if data is None:
                    if now - last_received > ttl:
                        why = f"no packet from the primary for {ttl:.1f}s (connection-ttl)"
                        break
                elif not data:
                    why = "connection closed by the primary"
                    break
                else:
                    last_received = now
                    try:
                        packets = reader.feed(data)
                    except ProtocolError as exc:
                        self._post(self.end, Outcome.RESYNC, f"bad data from the primary: {exc}")
                        return
                    top = 0
                    applied = False
                    synced: int | None = None
                    for pkt in packets:
                        t = type(pkt)
                        if t is p.ReplicaOps:
                            try:
                                ops = p.decode_ops(pkt)
                            except ProtocolError as exc:
                                self._post(self.end, Outcome.RESYNC, f"bad replication record from the primary: {exc}")
                                return
                            if pkt.position == 0:
                                self.copied += sum(len(op.data) for op in ops if op.op == COPY)
                            self._applier.apply(pkt.kind, ops)
                            applied = True
                            top = max(top, pkt.position)  # copied data (position 0) is not acknowledged
                        elif t is p.Ping:
                            self._send(p.Pong())
                        elif t is p.ReplicaAccept:
                            self._accept(pkt)
                        elif t is p.ReplicaSyncDone:
                            synced = pkt.position
                        elif t is not p.Pong:
                            self._post(self.packet, pkt)
                    # While copying, each round's data goes to disk as it comes: the final sync (which
                    # the first batch gated on this backup waits for) then holds only the last round.
                    if synced is not None or (applied and (self.fsync or copying)):
                        self._applier.sync()
                    if synced is not None and copying:
                        copying = False
                        os.unlink(self.root / SYNCING_MARK)
                        jf.fsync_dir(self.root)
                    if top:
                        self._send(p.ReplicaAck(top))
                    if synced is not None and not self.synced:
                        self.synced = True  # before the loop can hear of the link's end (same queue)
                        self.state = "in-sync"
                        self._send(p.ReplicaSynced(synced))
                        self._post(self._in_sync)
                if now - last_ping >= pace:
                    last_ping = now
                    self._send(p.Ping())
        except OSError as exc:
            # Set here, not on the loop: run() must see it even when the link ended first.
            self.disk_error, self.apply_error = exc, f"cannot apply the stream: {exc}"
            self._post(self.end, Outcome.RESYNC, self.apply_error)
            return
        except ReplicaError as exc:
            self.apply_error = f"cannot apply the stream: {exc}"
            self._post(self.end, Outcome.RESYNC, self.apply_error)
            return
        finally:
            self._applier.close()
        if not self._closing:
            self._post(self.lost, why)

    def _accept(self, pkt: p.ReplicaAccept) -> None:
        """(Link thread) taken on: set the old data aside before the first operation is applied."""
        self.fsync = pkt.backup_fsync
        self.primary_sequence = pkt.activation_sequence
        self.state = "syncing"
        self.accepted = True
        self._post(self._accepted, pkt.node_id)
        self.moved = prepare(self.root, self.cfg.max_saved_replicated_journal_size)
        if self.moved is not None:
            log.warning("old data moved to %s", self.moved)

    def _accepted(self, node_id: str) -> None:
        self._adopt(node_id)
        log.info("primary %s took this backup on (node %s)", self.peer, node_id)

    def _in_sync(self) -> None:
        if not self.result.done():
            log.warning("in sync with primary %s: ready to take over", self.peer)
            self._follow = self.loop.create_task(self._in_sync_cb(), name="replica-follow")

    # ------------------------------------------------------------ packets
    def packet(self, pkt: Any) -> None:
        """(Loop) what the primary says besides the stream."""
        t = type(pkt)
        if t is p.ReplicaSyncStart:
            self.total = pkt.total_bytes
            log.info("syncing %d files (%d bytes) from %s", pkt.files, pkt.total_bytes, self.peer)
        elif t is p.ReplicaStop:
            self.stop_failover = pkt.failover
            log.warning("primary %s ends the replication: %s", self.peer, pkt.reason)
        elif t is p.Error:
            err = error_for(pkt.code, pkt.message)
            if self.accepted:  # the primary ends a replication it had begun: it lives on, no takeover
                log.warning("primary %s ended the replication with an error: %s", self.peer, err)
                self.end(Outcome.RESYNC, f"error from the primary: {err}")
            else:
                log.warning("primary %s refused this backup: %s", self.peer, err)
                self.end(Outcome.RETRY, f"refused: {err}")
        elif t is p.HelloOk:
            if not pkt.active:
                self.end(Outcome.RETRY, f"{self.peer} is not active")

    async def _stop_thread(self) -> None:
        """End the link (what was read is applied; the rest is not acknowledged) and wait for the thread."""
        self._closing = True
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        if sock is not None:
            sock.close()
        if self._relay is not None:
            await asyncio.wait([self._relay])
            self._relay = None

    def request_failback(self) -> None:
        """(In sync) ask the server we replicate to step down and hand its node to us."""
        self._send(p.ReplicaFailback())

    # ---------------------------------------------------------------- end
    def lost(self, why: str) -> None:
        """The link is gone: take over if in sync (and not dropped by a primary that lives on)."""
        if self.stop_failover is False:
            self.end(Outcome.RESYNC, "dropped by the primary")
        elif self.synced:
            self.end(Outcome.TAKE_OVER, why)
        elif self.accepted:
            self.end(Outcome.RESYNC, f"{why} before the sync completed")
        else:
            self.end(Outcome.RETRY, why)

    def fail_disk(self, exc: OSError, why: str) -> None:
        """This server's disk failed under the replica: end the link; the activation stops the server."""
        self.disk_error = exc
        self.apply_error = why
        self.end(Outcome.RESYNC, why)

    def end(self, outcome: Outcome, why: str) -> None:
        if not self.result.done():
            self.result.set_result((outcome, why))

    def status(self) -> str:
        if self.state == "syncing":
            pct = 100 * self.copied // self.total if self.total else 0
            return f"syncing {min(pct, 99)}%"
        return self.state
