"""Activations: the life of a server under each HA policy, one class each (as Artemis's activations).

An activation decides *when* its broker may serve, from the node manager's locks
and state byte; the broker does the serving and the stepping down, called
through `ActivationHost` (ha/host.py) — ha/ never imports the broker. The live
lock is the only licence to serve: whoever holds it is the one active server of
the shared store, so two never serve at once.

Each activation is a small state machine: `step()` does at most one node-manager
operation (one lock or state-byte access, the unit a crash can fall between) and
returns what the broker should do next. `run()` drives it; the pair's model test
(tests/unit/test_ha_model.py) drives the same `step()`s of two servers
interleaved, with a crash possible between any two of them.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from pathlib import Path
from typing import Any

from ..errors import ConfigError, IllegalState, TandemError
from ..journal.storeio import Tap
from ..protocol import native as p
from .activation_sequence import read_local_sequence
from .announcer import announce
from .coordination import Coordination
from .coordinator import StaleActivation
from .host import ActivationHost
from .live_check import find_active
from .node_manager import FAILBACK, LIVE, NOT_STARTED, PAUSED, NodeManager
from .replica import Outcome, Replica
from .source import DirectoryWriter, Link, ReplicationSource

log = logging.getLogger("tandem.ha")


class Act(enum.Enum):
    """What a step asks of the broker."""

    PAUSE = "pause"  # wait lock-check-period, then step again
    WAITING = "waiting"  # report "waiting" (for a lock another server holds)
    ANNOUNCE = "announce"  # tell the active server where we are
    PASSIVE = "passive"  # follow the store (a warm backup) and announce
    SERVE = "serve"  # load the store and serve clients
    STEP_DOWN = "step-down"  # stop serving (clients fail over), keep the process
    STOP = "stop"  # stop the server
    LOST = "lost"  # the live lock is lost: stop at once, write nothing more


DONE = "done"

ANNOUNCER_STOP_TIMEOUT = 2.0  # s; activation never waits long on a link to a server that is gone


class Activation:
    """The broker's activation interface (its `Activation` Protocol), common to every mode."""

    role = "live-only"

    def __init__(self, host: ActivationHost, nm: NodeManager) -> None:
        self.host = host
        self.nm = nm
        cfg = host.config
        self.poll = cfg.lock_check_period / 1000
        self.failover_on_shutdown = cfg.failover_on_shutdown
        self.pc = "start"
        self.lost_reason = ""
        self._announcer: asyncio.Task[None] | None = None

    @property
    def node_id(self) -> str:
        return self.nm.node_id

    def step(self) -> Act | None:
        """One step of the state machine: at most one node-manager operation."""
        raise NotImplementedError

    def go(self, pc: str, act: Act | None = None) -> Act | None:
        self.pc = pc
        return act

    def _lock_lost(self) -> bool:
        """While serving, every lock-check-period: is the live lock still ours?"""
        reason = self.nm.live_lock_lost()
        if reason is None:
            return False
        self.lost_reason = reason
        self.pc = DONE
        return True

    async def start(self) -> None:
        """What must happen before the broker listens (live-only: serve, or refuse a store in use)."""

    async def advance(self) -> bool:
        """Step until a step pauses (True) or the activation is over (False)."""
        while self.pc != DONE:
            act = self.step()
            if act is Act.PAUSE:
                return True
            if act is not None:
                await self._do(act)
        return False

    async def run(self) -> None:
        """The rest of the server's life, as a task its broker owns (cancelled on stop)."""
        try:
            while await self.advance():  # noqa: ASYNC110 - a file lock has no event to await
                await asyncio.sleep(self.poll)
        finally:
            await self._stop_announcing()

    async def _do(self, act: Act) -> None:
        host = self.host
        if act is Act.WAITING:
            host.report("waiting")
        elif act is Act.ANNOUNCE:
            self._start_announcing()
        elif act is Act.PASSIVE:
            self._start_announcing()
            await host.start_backup()
        elif act is Act.SERVE:
            await self._stop_announcing()
            await host.start_live()
        elif act is Act.STEP_DOWN:
            await host.stop_live()
        elif act is Act.STOP:
            await host.stop(leave_state=False)
        elif act is Act.LOST:
            host.lock_lost(self.lost_reason)

    def _start_announcing(self) -> None:
        """While waiting, tell the active server of our connector (it tells its clients)."""
        if self._announcer is None and self.host.config.static_connectors:
            self._announcer = asyncio.create_task(announce(self.host, self.nm.node_id), name="announcer")

    async def _stop_announcing(self) -> None:
        task, self._announcer = self._announcer, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=ANNOUNCER_STOP_TIMEOUT)
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: it ended on its own, nothing to report

    def stop_state(self, failover: bool) -> bytes:
        """State to leave on a stop: P (clean, no failover) or L (fail over: let a backup take over)."""
        return LIVE if failover or self.failover_on_shutdown else PAUSED

    @property
    def store_tap(self) -> Tap | None:
        """Where the store's file operations go besides the disk (a replicating primary's stream)."""
        return None

    def accept_replica(self, link: Link, pkt: p.ReplicaStart, writers: list[DirectoryWriter], data_dir: Path) -> None:
        raise IllegalState(
            f"replication refused: this server is not a replication primary (ha-policy {self.host.config.ha_policy})"
        )

    def replication(self) -> dict[str, Any]:
        """Replication state for `status` (nothing outside the replication policies)."""
        return {}

    async def activation_info(self) -> dict[str, Any]:
        """The activation sequence as this server holds it and as ZooKeeper does (replication only)."""
        return {"coordinator": "none", "local": None, "zookeeper": None, "verdict": None}

    def release(self, state: bytes | None) -> None:
        """The broker stopped serving: leave `state` (if any) and let go of every lock."""
        if state is not None:
            self.nm.set_state(state)
        self.nm.close()


class LiveOnlyActivation(Activation):
    async def start(self) -> None:
        await self.advance()

    def step(self) -> Act | None:
        nm = self.nm
        match self.pc:
            case "start":
                if not nm.try_live():
                    raise IllegalState(
                        f"data directory {self.host.config.data_path} is in use by another running broker "
                        "(its server.lock is held)"
                    )
                return self.go("mark")
            case "mark":
                nm.set_state(LIVE)
                return self.go("serve")
            case "serve":
                return self.go("live", Act.SERVE)
            case "live":
                return Act.LOST if self._lock_lost() else Act.PAUSE
        raise AssertionError(self.pc)

    def stop_state(self, failover: bool) -> bytes:
        return PAUSED


class SharedStorePrimaryActivation(Activation):
    """Waits for the live lock; while a backup serves in its place (state L), asks for failback (F).

    It keeps asking: a backup may take over after the primary's first look (the store was
    still free) or write L over its F (both read L, then the backup wrote it). The primary
    lock, held from the start until L is written, tells a backup whether an F still stands.
    """

    role = "primary"

    def step(self) -> Act | None:
        nm = self.nm
        match self.pc:
            case "start":
                if nm.try_primary():
                    return self.go("waiting")
                return Act.PAUSE  # another primary of this store is starting
            case "waiting":
                return self.go("announce", Act.WAITING)
            case "announce":
                return self.go("lock", Act.ANNOUNCE)
            case "lock":
                if nm.try_live():
                    return self.go("mark")
                return self.go("ask")
            case "ask":
                # L: a backup serves (or is taking over): ask it to step down. F: asked already.
                # P or N: a backup holds the lock only to look at the state; it lets go.
                if nm.state() == LIVE:
                    return self.go("request")
                return self.go("lock", Act.PAUSE)
            case "request":
                log.warning("the backup is active; requesting failback")
                nm.set_state(FAILBACK)
                return self.go("lock", Act.PAUSE)
            case "mark":
                nm.set_state(LIVE)
                return self.go("unclaim")
            case "unclaim":
                nm.release_primary()
                return self.go("live", Act.SERVE)
            case "live":
                return Act.LOST if self._lock_lost() else Act.PAUSE
        raise AssertionError(self.pc)


class SharedStoreBackupActivation(Activation):
    role = "backup"

    def __init__(self, host: ActivationHost, nm: NodeManager) -> None:
        super().__init__(host, nm)
        cfg = host.config
        self.allow_failback = cfg.allow_failback
        self.restart_backup = cfg.restart_backup

    def step(self) -> Act | None:
        nm = self.nm
        match self.pc:
            case "start":
                return self.go("queue", Act.WAITING)
            # Take the backup lock (first in line), but never while a live primary asks for failback.
            case "queue":
                if nm.state() == FAILBACK:
                    return self.go("queue-primary")
                return self.go("queue-lock")
            case "queue-primary":
                if nm.primary_waiting():
                    return self.go("queue", Act.PAUSE)
                return self.go("queue-lock")  # F from a primary that died asking
            case "queue-lock":
                if nm.try_backup():
                    return self.go("queue-recheck")
                return self.go("queue", Act.PAUSE)
            case "queue-recheck":
                if nm.state() == FAILBACK:
                    return self.go("queue-recheck-primary")
                return self.go("passive")
            case "queue-recheck-primary":
                if nm.primary_waiting():
                    return self.go("queue-leave")
                return self.go("passive")
            case "queue-leave":
                nm.release_backup()
                return self.go("queue", Act.PAUSE)
            case "passive":
                return self.go("poll", Act.PASSIVE)
            # Hold the live lock only when the primary crashed (state L), or stopped with failover,
            # or asked for failback (F) and died before it was live.
            case "poll":
                if nm.try_live():
                    return self.go("check")
                return Act.PAUSE
            case "check":
                state = nm.state()
                if state == LIVE or (state == PAUSED and self.failover_on_shutdown):
                    return self.go("take")
                if state == FAILBACK:
                    return self.go("check-primary")
                # P: a clean stop; N: never started.
                return self.go("give")
            case "check-primary":
                if nm.primary_waiting():
                    return self.go("give")  # the primary is coming back: it takes the lock
                log.warning("the primary asked for failback and is gone")
                return self.go("take")
            case "give":
                nm.release_live()
                return self.go("poll", Act.PAUSE)
            case "take":
                nm.set_state(LIVE)
                return self.go("unqueue")
            case "unqueue":
                nm.release_backup()  # the next backup may queue up now
                log.warning("primary is gone: backup activating", extra={"node_id": nm.node_id})
                return self.go("live", Act.SERVE)
            case "live":
                if self._lock_lost():
                    return Act.LOST
                if self.allow_failback:
                    return self.go("failback")
                return Act.PAUSE
            case "failback":
                if nm.state() == FAILBACK:
                    return self.go("failback-primary")
                return self.go("live", Act.PAUSE)
            case "failback-primary":
                if nm.primary_waiting():
                    log.warning("primary asks for failback: backup stepping down")
                    # Leave F: the primary takes the live lock and writes L.
                    return self.go("stepped-down", Act.STEP_DOWN)
                return self.go("live", Act.PAUSE)  # the primary that asked died: serve on
            case "stepped-down":
                nm.release_live()
                return self.go("start" if self.restart_backup else "stop")
            case "stop":
                return self.go(DONE, Act.STOP)
        raise AssertionError(self.pc)


def _coordination(host: ActivationHost) -> Coordination | None:
    zk = host.config.ha.coordinator
    return Coordination(host, zk) if zk is not None else None


def _coordination_status(co: Coordination | None) -> dict[str, Any]:
    if co is None:
        return {"coordinator": "none"}
    return {"activation_sequence": co.local_sequence(), "coordinator": co.state()}


async def _describe(co: Coordination | None, directory: Path) -> dict[str, Any]:
    if co is not None:
        return await co.describe()
    try:
        local: int | None = read_local_sequence(directory)
    except TandemError:
        local = None
    return {"coordinator": "none", "local": local, "zookeeper": None, "verdict": None}


def _quiet(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("opening the ZooKeeper session failed: %s", task.exception())


def _uncoordinated(host: ActivationHost) -> None:
    """A replicated pair runs without a coordinator only when told to, and says what that risks."""
    cfg = host.config
    if not cfg.allow_uncoordinated:
        raise ConfigError(
            f"`ha-policy = {cfg.ha_policy!r}` needs a coordinator, and none is configured: set "
            "`allow-uncoordinated = true` to run the pair without one (a network partition can then "
            "make both servers active: see docs/ha.md)"
        )
    log.warning(
        "replication without a coordinator (allow-uncoordinated = true): if the link between primary "
        "and backup breaks while both run, both serve (split brain)"
    )


class ReplicationActivation(Activation):
    """Both replication policies, one life: follow an active server as its backup (ha/replica.py)
    until it goes or hands over, then serve the node with a replication source (ha/source.py),
    which takes a backup in turn, until this server hands over (failback) or stops.

    A replication-backup starts by following; a replication-primary serves at once, unless
    check-for-live-server finds a server active for its node: then it follows that one first and,
    with allow-failback, asks it for the node back once in sync (decision 0035). A server asked
    so steps down as a clean stop hands over, then follows again (restart-backup) or stops.
    """

    def __init__(self, host: ActivationHost, nm: NodeManager) -> None:
        super().__init__(host, nm)
        cfg = host.config
        self.retry = cfg.retry_replication_wait / 1000
        self.allow_failback = cfg.allow_failback
        self.restart_backup = cfg.restart_backup
        self.coordination = _coordination(host)
        self.replica: Replica | None = None
        self.source: ReplicationSource | None = None  # while serving
        self.following = True  # (False once serving)
        self.failback_from: str | None = None  # the backup that asked for the node back
        self.current = False  # the next _follow starts with a copy the coordinator has not called stale
        self._session: asyncio.Task[Any] | None = None
        self._bumping: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.coordination is None:
            _uncoordinated(self.host)
        if not self.nm.try_live():
            raise IllegalState(
                f"data directory {self.host.config.data_path} is in use by another running broker "
                "(its server.lock is held)"
            )

    async def run(self) -> None:
        host = self.host
        while True:
            if self.following:
                if not await self._follow():
                    return
                await self._serve()
            if not await self._serving():
                return  # the lock is lost: the broker stops
            if not await self._step_down():
                continue  # the backup that asked is gone: serving on
            if not self.restart_backup:
                log.warning("handed the node over; restart-backup = false: stopping")
                await host.stop(leave_state=False)
                return
            self.following = True

    # ------------------------------------------------------------ as a backup
    def _asks_failback(self) -> bool:
        """A primary following the server that took its node over asks for it back once in sync."""
        return False

    async def _follow(self) -> bool:
        """Replicate an active server until this replica, in sync, may take over (True), or its
        disk fails (False: the broker stops)."""
        host = self.host
        cfg = host.config
        urls = [cfg.connector_url(n) for n in cfg.static_connectors]
        host.report("waiting")
        # This copy was in sync when its active server went (or is a primary's own, refused the live
        # lock at start) and no coordinator has called it stale: while nobody serves, it tries again
        # to activate (the coordinator decides), rather than wait for ever for a server to follow
        # (a ZooKeeper outage outlasting a takeover attempt, a lock holder that died).
        current, self.current = self.current, False
        while True:
            outcome = Outcome.RETRY
            why = "no primary"
            for url in urls:
                if url == host.own_connector():
                    continue
                self.replica = Replica(cfg, host.own_connector(), self._adopt, self._in_sync)
                outcome, why = await self.replica.run(url)
                if self.replica.disk_error is not None:
                    # Nothing it failed to write was acknowledged; syncing again would meet the same
                    # disk: stop as a primary does on a disk error (its primary carries on alone).
                    host.storage_failed(self.replica.disk_error)
                    return False
                if outcome is not Outcome.RETRY:
                    break
            if outcome is Outcome.TAKE_OVER:
                refused, current = await self._may_take_over()
                if refused is None:
                    break
                log.error(
                    "primary is gone (%s) but this backup does not activate: %s%s",
                    why,
                    refused,
                    " (it tries again while nobody serves)" if current else "",
                )
                outcome = Outcome.RESYNC
            elif outcome is Outcome.RETRY and current:
                refused, current = await self._may_take_over()
                if refused is None:
                    why = "nobody serves its node, and the coordinator lets this current copy activate"
                    break
                log.info("still not activating: %s", refused)
            else:
                current = False  # a primary took it on: the copy is being replaced
            if self.replica is not None and self.replica.synced:
                await host.stop_backup()  # the follower lets go: the next sync replaces the store
            if outcome is Outcome.RESYNC:
                log.warning("replication from %s ended (%s): starting again", self.replica and self.replica.peer, why)
            host.report("waiting")
            await asyncio.sleep(self.retry)
        log.warning("primary is gone (%s): backup activating", why, extra={"node_id": self.nm.node_id})
        return True

    def _adopt(self, node_id: str) -> None:
        """A backup serves its primary's node: clients fail over within one node id."""
        self.nm.set_node_id(node_id)
        if self.coordination is not None and self._session is None:
            # Open the session now, so that a takeover does not wait for it.
            session = asyncio.get_running_loop().create_task(self.coordination.open(node_id))
            session.add_done_callback(_quiet)
            self._session = session

    async def _in_sync(self) -> None:
        co, r = self.coordination, self.replica
        if co is not None and r is not None:
            # The value the primary took this link on with, not one read from ZooKeeper now: a
            # read answered after a drop of this link would see the bump that makes this copy stale.
            if r.primary_sequence >= 0:
                try:
                    await asyncio.to_thread(co.copy_sequence, r.primary_sequence)
                except OSError as exc:  # in sync, yet unable ever to take over: a disk error, as in the applier
                    r.fail_disk(exc, f"cannot write the activation sequence: {exc}")
                    return
            else:
                log.warning("the primary sent no activation sequence (no coordinator?): this replica cannot take over")
        await self.host.start_backup()
        r = self.replica
        if r is not None and self._asks_failback():
            log.warning("in sync with the active server %s: asking it to step down (allow-failback)", r.peer)
            r.request_failback()

    async def _may_take_over(self) -> tuple[str | None, bool]:
        """(None, _) if this in-sync replica may activate (uncoordinated: always), else (why not,
        whether it may later: False only when the coordinator says the copy is stale)."""
        co = self.coordination
        if co is None:
            return None, False
        if self._session is not None:
            await asyncio.wait([self._session])  # one session: let the one being opened finish
            self._session = None
        try:
            return await co.activate(self.nm.node_id), True
        except StaleActivation as exc:
            return exc.message, False
        except TandemError as exc:
            return exc.message, True

    async def activation_info(self) -> dict[str, Any]:
        return await _describe(self.coordination, self.host.config.data_path)

    # ------------------------------------------------------------- as active
    async def _serve(self) -> None:
        """Serve the node (the live lock, and the coordinator's when there is one, are ours)."""
        source = ReplicationSource(self.host.config)
        source.node_id = self.nm.node_id
        source.on_failback = self._failback_asked
        co = self.coordination
        if co is not None:
            source.on_alone = self._alone
            source.activation_sequence = lambda: -1 if co.sequence is None else co.sequence
        source.start()
        self.source = source
        self.following = False
        self.failback_from = None
        self.nm.set_state(LIVE)
        await self.host.start_live()
        if self.coordination is not None:
            self.coordination.watch()

    async def _serving(self) -> bool:
        """Until a backup in sync asks for the node (True) or the lock is lost (False: stopping)."""
        while self.failback_from is None:
            if self._lock_lost():
                self.host.lock_lost(self.lost_reason)
                return False
            await asyncio.sleep(self.poll)
        return True

    def _failback_asked(self, connector: str) -> None:
        if not self.allow_failback:
            log.warning("backup %s asks for the node back: refused (allow-failback = false)", connector)
        elif self.failback_from is None:
            self.failback_from = connector

    async def _step_down(self) -> bool:
        """Hand the node to the backup that asked, as a clean stop does: no client served any more,
        every batch streamed, then REPLICA_STOP(failover) tells it to take over. False, and serving
        on, if that backup is no longer in sync when it would be told: dropped, it may never
        activate (its copy is stale once this server has claimed a new activation sequence), and
        stepping down for it would leave the node to nobody."""
        asker, self.failback_from = self.failback_from, None
        if not self._hands_over_to(asker):
            log.warning("failback: backup %s is gone before this server stepped down: serving on", asker)
            return False
        log.warning("failback: stepping down for %s, which takes the node over", asker)
        await self.host.stop_live()
        source = self.source
        if not self._hands_over_to(asker):
            log.warning("failback: backup %s went while this server stopped: serving again", asker)
            await self.host.start_live(again=True)
            return False
        # From here to source.close no await: the backup cannot be dropped (and a new activation
        # sequence claimed) between the check and the hand-over.
        self.source = None
        assert source is not None
        source.close(failover=True)
        if self._bumping is not None:
            self._bumping.cancel()
        co = self.coordination
        if co is not None:
            await asyncio.to_thread(co.close)  # the live lock goes now: the backup claims it
            self.coordination = _coordination(self.host)
            self._session = None
        self.host.report("waiting")
        return True

    def _hands_over_to(self, connector: str | None) -> bool:
        return connector is not None and self.source is not None and self.source.in_sync_with(connector)

    def _alone(self) -> None:
        if self._bumping is None or self._bumping.done():
            self._bumping = asyncio.get_running_loop().create_task(self._bump(), name="activation-bump")

    async def _bump(self) -> None:
        """The backup is dropped: record in ZooKeeper that this copy alone is current, then confirm."""
        co, source = self.coordination, self.source
        assert co is not None and source is not None
        try:
            await co.bump()
        except Exception as exc:  # SessionLost, ZooKeeper unavailable: no proof we may go on
            self.host.lock_lost(f"could not record that it carries on without its backup: {exc}")
            return
        source.release()

    @property
    def store_tap(self) -> Tap | None:
        return self.source

    def accept_replica(self, link: Link, pkt: p.ReplicaStart, writers: list[DirectoryWriter], data_dir: Path) -> None:
        if self.source is None:
            super().accept_replica(link, pkt, writers, data_dir)
        else:
            self.source.accept(link, pkt, writers, data_dir)

    def replication(self) -> dict[str, Any]:
        co = _coordination_status(self.coordination)
        s, r = self.source, self.replica
        if s is not None:
            return {"replication": s.state(), "replication_peer": s.peer, "replication_lag": s.lag()} | co
        if self.following and r is not None:
            return {"replication": r.status(), "replication_peer": r.peer} | co
        return {"replication": "unreplicated", "replication_peer": None} | co

    def release(self, state: bytes | None) -> None:
        # A stopping server that serves, whatever the reason, hands over to a backup in sync (as
        # Artemis's replication does: not configurable).
        if self.source is not None:
            self.source.close(failover=True)
        if self._bumping is not None:
            self._bumping.cancel()
        if self.coordination is not None:
            self.coordination.close()
        super().release(state)


class ReplicationPrimaryActivation(ReplicationActivation):
    """Serves its own data directory and streams it to a backup, unless a server is active for
    its node already (check-for-live-server): then it syncs from that one as a backup first."""

    role = "primary"

    async def start(self) -> None:
        await super().start()
        host, cfg, co = self.host, self.host.config, self.coordination
        if cfg.check_for_live_server and not cfg.static_connectors:
            log.warning(
                "check-for-live-server = true but no static-connectors: this primary cannot look for a "
                "server active for its node (set static-connectors to its backup's connector)"
            )
        if cfg.check_for_live_server:
            url = await find_active(cfg, host.own_connector(), self.nm.node_id)
            if url is not None:
                log.warning(
                    "an active server for this node found at %s: syncing from it as a backup%s",
                    url,
                    ", then failing back (allow-failback)" if self.allow_failback else "",
                )
                return  # run() follows it
        elif co is None:
            log.warning(
                "check-for-live-server = false and no coordinator: if a backup took this node over "
                "while this server was down, both now serve it, this one with its stale data (see docs/ha.md)"
            )
        if co is not None:
            current = True
            try:
                why = await co.activate(self.nm.node_id)
            except StaleActivation as exc:
                why, current = exc.message, False
            if why is not None:
                if not cfg.check_for_live_server:
                    co.close()
                    raise IllegalState(f"not activating: {why}")
                # Its backup may be taking the node over at this moment (it holds the live lock, and
                # was not active yet when we looked): wait as a backup, as Artemis's primary does.
                log.warning(
                    "not activating: %s; waiting for an active server to follow%s",
                    why,
                    " or for the live lock" if current else "",
                )
                self.current = current
                return  # run() follows
        await self._serve()

    def _asks_failback(self) -> bool:
        return self.allow_failback

    def stop_state(self, failover: bool) -> bytes:
        return PAUSED


class ReplicationBackupActivation(ReplicationActivation):
    """Replicates a primary into its own data directory; takes over when the primary goes while
    it is in sync, and serves as a primary does. Never activates on its own at a cold start."""

    role = "backup"


def make_activation(host: ActivationHost, nm: NodeManager) -> Activation:
    """The activation for the host's `ha-policy` (a new mode is a new class here, and a line)."""
    policy = host.config.ha_policy
    if policy == "replication-primary":
        return ReplicationPrimaryActivation(host, nm)
    if policy == "replication-backup":
        return ReplicationBackupActivation(host, nm)
    if policy == "shared-store-primary":
        return SharedStorePrimaryActivation(host, nm)
    if policy == "shared-store-backup":
        return SharedStoreBackupActivation(host, nm)
    return LiveOnlyActivation(host, nm)


__all__ = ["DONE", "NOT_STARTED", "Act", "Activation", "make_activation"]
