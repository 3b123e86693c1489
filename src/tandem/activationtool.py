"""`tandem data activation show|set`: inspect and repair activation sequences (docs/cli.md).

`show` reads; `set` overwrites the data directory's copy and, with `--zookeeper`, the node
id's coordinated value. Setting a value by hand can let a stale replica activate, so `set`
refuses while a broker holds the directory or any server is in the node id's live lock line.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import IO, Any

from .config import CoordinatorConfig
from .datatool import _stopped
from .errors import IllegalState, InvalidArgument
from .ha.activation_sequence import SEQUENCE_FILE, judge, read_local_sequence, write_local_sequence
from .ha.coordinator import KAZOO_LOG, Coordinator
from .ha.lockfile import ID_LEN, ID_POS


def _node_id_of(data: Path) -> str | None:
    """The node id in `server.lock`, read without creating or locking anything."""
    try:
        with (data / "server.lock").open("rb") as f:
            raw = os.pread(f.fileno(), ID_LEN, ID_POS)
    except OSError:
        return None
    return str(uuid.UUID(bytes=raw)) if len(raw) == ID_LEN else None


def _coordinator(zookeeper: str | None, node_id: str | None, root: str, connect_timeout: int) -> Coordinator | None:
    if zookeeper is None:
        if node_id is not None:
            raise InvalidArgument("--node-id names a znode: give --zookeeper too")
        return None
    if not node_id:
        raise InvalidArgument("--zookeeper needs --node-id (the pair's node id, as the servers use it)")
    try:
        cfg = CoordinatorConfig(zookeeper=zookeeper, root=root, connect_timeout=connect_timeout)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    logging.getLogger(KAZOO_LOG).setLevel(logging.CRITICAL)  # its retries are noise here: our error says it all
    c = Coordinator.from_config(cfg, node_id, holder=f"tandem data activation (pid {os.getpid()})")
    c.start()
    return c


def show_activation(
    directory: str,
    out: IO[str],
    *,
    zookeeper: str | None = None,
    node_id: str | None = None,
    root: str = "/tandem",
    connect_timeout: int = 8000,
    as_json: bool = False,
) -> int:
    data = Path(directory)
    local = read_local_sequence(data)
    info: dict[str, Any] = {
        "data_directory": str(data),
        "server_lock_node_id": _node_id_of(data),
        "local": local,
        "zookeeper": None,
        "verdict": None,
        "live_lock": None,
    }
    coord = _coordinator(zookeeper, node_id, root, connect_timeout)
    if coord is not None:
        try:
            coordinated = coord.activation_sequence()
            info.update(
                node_id=node_id,
                znode=coord.sequence_path,
                zookeeper=coordinated,
                verdict=judge(local, coordinated).value,
                live_lock=coord.live_lock_holders(),
            )
        finally:
            coord.close()
    if as_json:
        print(json.dumps(info, indent=2), file=out)
        return 0
    print(f"data directory   {data}", file=out)
    print(f"server.lock id   {info['server_lock_node_id'] or '-'}", file=out)
    where = data / SEQUENCE_FILE
    print(f"local            {local}   ({where}{'' if where.exists() else ': none yet'})", file=out)
    if coord is not None:
        coordinated = info["zookeeper"]
        note = f"  (claim of {-coordinated} in progress)" if coordinated < 0 else ""
        print(f"zookeeper        {coordinated}   ({info['znode']} at {zookeeper}){note}", file=out)
        line = info["live_lock"]
        holders = "free" if not line else f"held by {line[0]!r}" + "".join(f", then {h!r}" for h in line[1:])
        print(f"live lock        {holders}", file=out)
        print(f"verdict          {info['verdict']}", file=out)
    return 0


def set_activation(
    directory: str,
    value: int,
    out: IO[str],
    *,
    zookeeper: str | None = None,
    node_id: str | None = None,
    root: str = "/tandem",
    connect_timeout: int = 8000,
) -> int:
    if value < 0:
        raise InvalidArgument(f"an activation sequence is set to a value >= 0, got {value}")
    data = Path(directory)
    with _stopped(data, "setting its activation sequence"):
        coord = _coordinator(zookeeper, node_id, root, connect_timeout)
        try:
            if coord is not None:
                line = coord.live_lock_holders()
                if line:
                    raise IllegalState(
                        f"servers are in the live lock's line of node {node_id} ({', '.join(map(repr, line))}): "
                        "stop them before setting the activation sequence"
                    )
                before = coord.activation_sequence()
                coord.set_activation_sequence(value)
                print(f"ZooKeeper {coord.sequence_path}: {before} → set to {value}", file=out)
            before_local = read_local_sequence(data)
            write_local_sequence(data, value)
            print(f"{data / SEQUENCE_FILE}: {before_local} → set to {value}", file=out)
        finally:
            if coord is not None:
                coord.close()
    return 0
