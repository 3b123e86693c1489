"""Model check of the shared-store pair's lock-file protocol, built from the real activations.

The servers are the real `step()` state machines of ha/activation.py over the real
in-memory node manager (one `SharedStore` is the lock file). Every step does at most
one lock or state-byte operation, so exploring every interleaving of the servers'
steps, with a crash (all of that server's locks released, its state writes kept)
possible between any two of them and a restart of a crashed server, covers every
order in which real processes can reach the file. The broker's side of each step
(serve, step down, stop) is applied by the model: serving is a flag.

Checked over every reachable state, up to a bound on crashes and restarts:
- safety: at most one server serves, and a serving server holds the live lock;
- outcome: once the crashes stop, every run ends (in a bottom strongly connected
  component of the crash-free steps) with exactly one server serving while any
  server process is alive — the only exception is a store that never had a live
  server (state N) with its primary dead: a backup never activates on that;
- failback: with `allow-failback`, a live primary process ends up the one serving.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import pytest

from tandem.config import load_config
from tandem.errors import TandemError
from tandem.ha.activation import DONE, Act, Activation, make_activation
from tandem.ha.lockfile import NOT_STARTED
from tandem.ha.node_manager import InMemoryNodeManager, SharedStore


@dataclass(frozen=True)
class Proc:
    policy: str
    alive: bool = True
    pc: str = "start"
    serving: bool = False
    crashes: int = 0
    restarts: int = 0


StoreKey = tuple[tuple[str, Any], ...]
Key = tuple[StoreKey, tuple[Proc, ...]]
_NOT_STATE = ("mutex", "node_id")


class Model:
    def __init__(self, backups: int, max_crashes: int, max_restarts: int, **ha: Any) -> None:
        self.max_crashes = max_crashes
        self.max_restarts = max_restarts
        self.ha = ha
        self.configs = {
            policy: load_config(
                None, name=policy, persistence_enabled=False, ha_policy=policy, lock_check_period=1, **ha
            )
            for policy in ("shared-store-primary", "shared-store-backup")
        }
        store = SharedStore()
        procs = (Proc("shared-store-primary"), *(Proc("shared-store-backup") for _ in range(backups)))
        self.initial: Key = (self._store_key(store, []), procs)

    # ------------------------------------------------------------- state <-> key
    @staticmethod
    def _store_key(store: SharedStore, nms: list[InMemoryNodeManager]) -> StoreKey:
        out = []
        for name, value in sorted(vars(store).items()):
            if name in _NOT_STATE:
                continue
            if value is None or isinstance(value, bytes):
                out.append((name, value))
            else:  # a lock holder: which server
                out.append((name, ("server", next(i for i, nm in enumerate(nms) if nm is value))))
        return tuple(out)

    def build(self, key: Key) -> tuple[SharedStore, list[InMemoryNodeManager], list[Activation]]:
        store_key, procs = key
        store = SharedStore()
        nms = [InMemoryNodeManager(store) for _ in procs]
        for name, value in store_key:
            setattr(store, name, nms[value[1]] if isinstance(value, tuple) else value)
        acts = []
        for p, nm in zip(procs, nms, strict=True):
            act = make_activation(SimpleNamespace(config=self.configs[p.policy]), nm)  # type: ignore[arg-type]
            act.pc = p.pc
            acts.append(act)
        return store, nms, acts

    # -------------------------------------------------------------- transitions
    def successors(self, key: Key) -> Iterator[tuple[bool, str, Key]]:
        """(is a fault, label, next key) for every move from `key`."""
        _, procs = key
        for i, p in enumerate(procs):
            if p.alive and p.pc != DONE:
                store, nms, acts = self.build(key)
                before = {k: v for k, v in vars(acts[i]).items() if k != "pc"}
                q = p
                try:
                    act = acts[i].step()
                except TandemError as exc:
                    nms[i].close()
                    q = replace(p, alive=False, serving=False)
                    label = f"{i}:{p.pc} raises {exc}"
                else:
                    assert {k: v for k, v in vars(acts[i]).items() if k != "pc"} == before, (
                        "an activation's only state must be its pc (the model rebuilds it from that)"
                    )
                    q = replace(p, pc=acts[i].pc)
                    if act is Act.SERVE:
                        q = replace(q, serving=True)
                    elif act is Act.STEP_DOWN:
                        q = replace(q, serving=False)
                    elif act is Act.STOP:
                        nms[i].close()  # the broker's stop(leave_state=False)
                        q = replace(q, alive=False, serving=False)
                    label = f"{i}:{p.pc}" + (f" [{act.value}]" if act is not None else "")
                yield False, label, self._key(store, nms, procs, i, q)
            if p.alive and p.crashes < self.max_crashes:
                store, nms, _ = self.build(key)
                nms[i].close()  # a kill -9: its locks go, what it wrote stays
                q = replace(p, alive=False, serving=False, crashes=p.crashes + 1)
                yield True, f"{i}: crash at {p.pc}", self._key(store, nms, procs, i, q)
            if not p.alive and p.restarts < self.max_restarts:
                store, nms, _ = self.build(key)
                q = replace(p, alive=True, pc="start", serving=False, restarts=p.restarts + 1)
                yield True, f"{i}: restart", self._key(store, nms, procs, i, q)

    def _key(self, store: SharedStore, nms: list[InMemoryNodeManager], procs: tuple[Proc, ...], i: int, q: Proc) -> Key:
        return self._store_key(store, nms), (*procs[:i], q, *procs[i + 1 :])

    # ------------------------------------------------------------------ explore
    def explore(self, limit: int = 400_000) -> tuple[dict[Key, tuple[Key, str] | None], dict[Key, list[Key]]]:
        parent: dict[Key, tuple[Key, str] | None] = {self.initial: None}
        calm: dict[Key, list[Key]] = {}  # crash-free successors
        todo = deque([self.initial])
        while todo:
            key = todo.popleft()
            calm[key] = []
            for fault, label, nxt in self.successors(key):
                if not fault:
                    calm[key].append(nxt)
                if nxt not in parent:
                    assert len(parent) < limit, "state space larger than the bound"
                    parent[nxt] = (key, label)
                    todo.append(nxt)
        return parent, calm

    def trace(self, parent: dict[Key, tuple[Key, str] | None], key: Key) -> str:
        steps = []
        while (p := parent[key]) is not None:
            key, label = p
            steps.append(label)
        return "\n  ".join(reversed(steps))


def bottom_components(calm: dict[Key, list[Key]]) -> list[list[Key]]:
    """Strongly connected components of the crash-free graph that no crash-free step leaves."""
    index: dict[Key, int] = {}
    low: dict[Key, int] = {}
    comp: dict[Key, int] = {}
    stack: list[Key] = []
    on: set[Key] = set()
    comps: list[list[Key]] = []
    counter = 0
    for root in calm:
        if root in index:
            continue
        work = [(root, iter(calm[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(calm[w])))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    members = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp[w] = len(comps)
                        members.append(w)
                        if w == v:
                            break
                    comps.append(members)
    return [c for n, c in enumerate(comps) if all(comp[w] == n for v in c for w in calm[v])]


CASES = [
    pytest.param(1, 2, 2, True, True, id="failback-restart"),
    pytest.param(1, 2, 2, True, False, id="failback-no-restart"),
    pytest.param(1, 2, 2, False, True, id="no-failback"),
    pytest.param(2, 1, 1, True, True, id="two-backups"),
]


@pytest.mark.parametrize(("backups", "crashes", "restarts", "allow_failback", "restart_backup"), CASES)
def test_the_pair_always_ends_with_exactly_one_live(
    backups: int, crashes: int, restarts: int, allow_failback: bool, restart_backup: bool, caplog: Any
) -> None:
    caplog.set_level(logging.ERROR, logger="tandem.ha")  # the activations' warnings, once per explored step
    model = Model(backups, crashes, restarts, allow_failback=allow_failback, restart_backup=restart_backup)
    parent, calm = model.explore()
    problems: dict[str, str] = {}  # the first example of each kind, with the steps that reach it

    def found(kind: str, key: Key) -> None:
        problems.setdefault(kind, f"{kind}: {key}\n  {model.trace(parent, key)}")

    for key in calm:  # safety, in every reachable state
        store_key, procs = key
        serving = [i for i, p in enumerate(procs) if p.serving]
        live = dict(store_key).get("live")
        if len(serving) > 1 or any(live != ("server", i) for i in serving):
            found("two serving, or serving without the live lock", key)
    for component in bottom_components(calm):  # the outcome, once crashes stop
        for key in component:
            store_key, procs = key
            state = dict(store_key)["state"]
            alive = [i for i, p in enumerate(procs) if p.alive]
            serving = [i for i, p in enumerate(procs) if p.serving]
            by_design = state == NOT_STARTED and not procs[0].alive
            if alive and len(serving) != 1 and not by_design:
                found(f"ends with {len(serving)} live while a server is alive", key)
            if allow_failback and procs[0].alive and serving != [0]:
                found("failback missed: the primary is alive and the backup serves", key)
    print(f"{len(calm)} states, {sum(map(len, calm.values()))} crash-free steps")
    assert not problems, "\n".join(problems.values())
