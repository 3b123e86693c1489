"""The `tandem` command: run a broker, send and receive, administer, inspect data, measure."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from . import __version__
from .config import BrokerConfig, load_config
from .errors import ConfigError, IllegalState, InvalidArgument, JournalIOError, LockLost, TandemError

DEFAULT_URL = os.environ.get("TANDEM_URL", "tcp://127.0.0.1:61616")


BROKER_SWITCH_INTERVAL = 0.0001  # seconds (decision 0016)
EXIT_STORAGE_FAILURE = 3  # `tandem run` after an I/O error in the store (docs/storage.md)
EXIT_LOCK_LOST = 4  # `tandem run` after losing its live lock (docs/ha.md)


def _install_loop_policy() -> None:
    """uvloop when installed (10-30% on this workload), plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _add_url(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_URL, help=f"broker URL (default {DEFAULT_URL}, env TANDEM_URL)")


def _json_or_table(rows: list[dict[str, Any]], columns: Sequence[str], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in columns]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths, strict=True)))


# ----------------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    from . import logs
    from .server import allocator

    overrides: dict[str, Any] = {}
    if args.data:
        overrides["data_directory"] = args.data
    if args.name:
        overrides["name"] = args.name
    if args.log_level:
        overrides["log_level"] = args.log_level
    cfg = load_config(args.config, **overrides)
    protocols: tuple[tuple[str, Literal["native", "stomp"]], ...] = (("bind", "native"), ("stomp_bind", "stomp"))
    for option, protocol in protocols:
        value = getattr(args, option)
        if not value:
            continue
        import msgspec

        from .config import AcceptorConfig, parse_host_port

        try:
            parse_host_port(value)
        except ValueError as exc:
            raise ConfigError(f"--{option.replace('_', '-')} {exc}") from None
        others = [a for a in cfg.acceptors if a.protocol != protocol]
        # The file's first acceptor of that protocol keeps its TLS settings; only its address changes.
        base = next((a for a in cfg.acceptors if a.protocol == protocol), None)
        acc = AcceptorConfig(protocol, protocol, value)
        if base is not None:
            acc = msgspec.structs.replace(base, name=protocol, bind=value)
        try:
            cfg = msgspec.structs.replace(cfg, acceptors=[*others, acc])
        except ValueError as exc:  # e.g. a network address with security off (config.check_network_exposure)
            raise ConfigError(f"--{option.replace('_', '-')} {value}: {exc}") from None
    if args.management_bind:
        cfg = _with_management_bind(cfg, args.management_bind)
    try:
        malloc = allocator.start_with(cfg.memory_allocator)  # may start this command again: first
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    from .server.broker import Broker
    from .server.memory import one_malloc_arena

    logs.setup(cfg.log_level)
    logging.getLogger("tandem.memory").info("memory allocator: %s", malloc)
    _install_loop_policy()
    # The journal writer thread needs the GIL back after each sync to report the batch; with
    # the default 5 ms switch interval a busy event loop can hold it that long, and every
    # confirmation waits. 0.1 ms: see decision 0016 and docs/performance.md.
    sys.setswitchinterval(BROKER_SWITCH_INTERVAL)
    one_malloc_arena()  # before the broker's threads: server/memory.py says why
    return asyncio.run(_run_broker(cfg, Broker, quiet=args.quiet))


def _with_management_bind(cfg: BrokerConfig, value: str) -> BrokerConfig:
    """`--management-bind`: the listener on, at this address (the file's [management] keys kept)."""
    import msgspec

    from .config import ManagementConfig

    try:
        mgmt = msgspec.structs.replace(cfg.management or ManagementConfig(), bind=value)
        return msgspec.structs.replace(cfg, management=mgmt)
    except ValueError as exc:  # a bad address, or a network address with security off
        raise ConfigError(f"--management-bind {value}: {exc}") from None


async def _run_broker(cfg: BrokerConfig, broker_cls: Any, quiet: bool) -> int:
    broker = broker_cls(cfg)
    if not quiet:
        broker.on_state = lambda state: print(f"[{time.strftime('%H:%M:%S')}] {cfg.name}: {state}", flush=True)
    await broker.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(broker.stop()))

    def on_sighup() -> None:  # TLS files (server/tls.py) and the users file (docs/security.md), at once
        broker.reload_tls(force=True)
        if cfg.security_enabled:
            broker.reload_users()

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    if not quiet:
        first = next(iter(broker.bound))
        native = broker.bound[first]
        url = f"{'tcps' if first in broker.tls else 'tcp'}://{native[0]}:{native[1]}"
        role = broker.activation.role if broker.activation is not None else "live-only"
        print(f"Tandem {__version__} broker {cfg.name!r} is up (node {broker.node_id}, {role})")
        for name, (host, port) in broker.bound.items():
            print(f"  listening  {name}: {host}:{port}")
        if broker.management is not None and broker.management.bound is not None:
            host, port = broker.management.bound
            print(f"  listening  management: {host}:{port}  ({broker.management.scheme}://{host}:{port}/api/overview)")
        if broker.active:
            print(f"  data       {cfg.data_path.resolve()}  ({broker.loaded_messages} messages reloaded)")
        elif cfg.ha_policy == "replication-backup":
            print(f"  data       {cfg.data_path.resolve()}  (a replica of the primary's; served if it takes over)")
        else:
            print(f"  data       {cfg.data_path.resolve()}  (shared; served once this server holds the live lock)")
        print("Send a first message from another shell:")
        print(f"  .venv/bin/tandem producer --url {url} --destination hello --count 1")
        print(f"  .venv/bin/tandem consumer --url {url} --destination hello --count 1")
        print("Stop with Ctrl-C.", flush=True)
    await broker.wait_stopped()
    if isinstance(broker.failure, JournalIOError):
        print(f"tandem: {broker.failure}", file=sys.stderr)
        return EXIT_STORAGE_FAILURE
    if isinstance(broker.failure, LockLost):
        print(f"tandem: {broker.failure}", file=sys.stderr)
        return EXIT_LOCK_LOST
    if broker.failure is not None:
        print(f"tandem: broker stopped: {broker.failure!r}", file=sys.stderr)
        return 1
    return 0


# ------------------------------------------------------- producer / consumer
def cmd_producer(args: argparse.Namespace) -> int:
    from .client.message import Message

    props = _parse_props(args.property)

    async def main() -> int:
        from .client.connection import connect

        conn = await connect(args.url)
        try:
            tx = args.tx_batch
            session = await conn.create_session(transacted=tx > 0)
            prod = session.create_producer(args.destination, window=args.window)
            body = os.urandom(args.size // 2).hex().encode()[: args.size].ljust(args.size, b"x")
            failures: list[BaseException] = []

            def done(exc: BaseException | None) -> None:
                if exc is not None:
                    failures.append(exc)

            for i in range(args.count):
                msg = Message(
                    body if args.text is None else args.text,
                    properties={**props, "seq": i},
                    durable=not args.non_durable,
                    priority=args.priority,
                    routing_type=args.routing_type,
                    dedup_id=f"{args.dedup}-{i}" if args.dedup else None,
                )
                await prod.send_async(msg, done)
                if tx and ((i + 1) % tx == 0 or i + 1 == args.count):
                    await session.commit()
            await prod.flush()
            confirmed = args.count - len(failures)
            print(f"sent {args.count}, confirmed {confirmed} to {args.destination!r}")
            if failures:
                print(f"error: {failures[0]}", file=sys.stderr)
            return 0 if not failures else 1
        finally:
            await conn.close()

    return asyncio.run(main())


def _parse_props(items: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise TandemError(f"--property expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def cmd_consumer(args: argparse.Namespace) -> int:
    async def main() -> int:
        from .client.connection import connect

        conn = await connect(args.url)
        got = 0
        try:
            session = await conn.create_session(ack_mode="client")
            consumer = await session.create_consumer(args.destination, filter=args.filter)
            deadline = time.monotonic() + args.timeout
            unacked = None
            while got < args.count:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                msg = await consumer.receive(left)
                if msg is None:
                    break
                got += 1
                unacked = msg
                if args.print:
                    print(msg.body.decode(errors="replace"))
                if got % 1000 == 0:
                    await msg.ack()
                    unacked = None
            if unacked is not None:
                await unacked.ack()
            await consumer.close()
        finally:
            await conn.close()
        print(f"received {got} of {args.count} from {args.destination!r}")
        return 0 if got >= args.count else 1

    return asyncio.run(main())


# ---------------------------------------------------------- administration
def _manage(url: str, op: str, call_timeout: int | None = None, **kw: Any) -> Any:
    async def main() -> Any:
        from .client.connection import connect

        extra = {} if call_timeout is None else {"call_timeout": call_timeout}
        conn = await connect(url, allow_passive=True, reconnect_attempts=0, **extra)
        try:
            return await conn.manage(op, **kw)
        finally:
            await conn.close()

    return asyncio.run(main())


def cmd_queue(args: argparse.Namespace) -> int:
    if args.action == "stat":
        rows = _manage(args.url, "queue.stat", name=args.name)
        cols = [
            "name",
            "address",
            "routing_type",
            "durable",
            "message_count",
            "delivering_count",
            "consumer_count",
            "paused",
            "messages_added",
            "messages_acknowledged",
            "paging",
            "paged_count",
            "memory_bytes",
        ]
        _json_or_table(rows, cols, args.json)
    elif args.action == "create":
        res = _manage(
            args.url,
            "queue.create",
            name=args.name,
            address=args.address,
            routing_type=args.routing_type,
            durable=not args.non_durable,
            filter=args.filter,
            max_consumers=args.max_consumers,
            exclusive=args.exclusive or None,
            last_value_key=args.last_value_key,
            reader_only=args.reader_only,
        )
        print(f"created queue {res['name']!r} on address {res['address']!r} ({res['routing_type']})")
    elif args.action == "delete":
        res = _manage(args.url, "queue.delete", name=args.name, force=args.force)
        print(f"deleted queue {args.name!r} ({res['removed']} messages removed)")
    elif args.action == "purge":
        res = _manage(args.url, "queue.purge", name=args.name)
        print(f"purged {res['removed']} messages from {args.name!r}")
    else:
        return _queue_operation(args)
    return 0


TRANSFER_TIMEOUT_MS = 660_000  # a move or retry answers within the broker's 600 s (server/admin.py)


def _queue_operation(args: argparse.Namespace) -> int:
    """browse, move, retry, pause, resume (docs/management.md, "Queue operations")."""
    if args.action == "browse":
        rows = _manage(
            args.url, "queue.browse", name=args.name, count=args.count, selector=args.selector, preview=args.preview
        )
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            _print_browsed(rows)
        return 0
    if args.action in ("pause", "resume"):
        res = _manage(args.url, f"queue.{args.action}", name=args.name)
        print(f"queue {args.name!r} is {'paused' if res['paused'] else 'delivering'}")
        return 0
    if args.action == "move":
        res = _manage(
            args.url,
            "queue.move",
            TRANSFER_TIMEOUT_MS,
            name=args.name,
            to=args.to,
            selector=args.selector,
            copy=args.copy,
            limit=args.limit,
        )
        verb = "copied" if args.copy else "moved"
        print(f"{verb} {res[verb]} messages from {args.name!r} to {args.to!r}")
    else:
        res = _manage(args.url, "queue.retry", TRANSFER_TIMEOUT_MS, name=args.name, selector=args.selector)
        print(f"retried {res['retried']} messages from {args.name!r}")
    if res.get("left"):
        print(f"{res['left']} matching messages stayed: {res.get('error', 'not routable')}")
    return 0


def _print_browsed(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        flags = " ".join(f for f in ("paged", "large") if r.get(f))
        print(
            f"seq {r['seq']}  id {r['id']}  priority {r['priority']}  deliveries {r['delivery_count']}  "
            f"{r['body_size']} bytes{'  ' + flags if flags else ''}"
        )
        for k, v in sorted(r["headers"].items()):
            print(f"  {k}: {v}")
        prefix = "base64 " if r["body_encoding"] == "base64" else ""
        print(f"  body: {prefix}{r['body_preview']!r}")
    print(f"({len(rows)} messages)")


def cmd_address(args: argparse.Namespace) -> int:
    if args.action == "list":
        rows = _manage(args.url, "address.list")
        for r in rows:
            r["routing_types"] = ",".join(r["routing_types"])
            r["queues"] = ",".join(r["queues"])
        _json_or_table(rows, ["name", "routing_types", "auto_created", "queues"], args.json)
    elif args.action == "create":
        _manage(args.url, "address.create", name=args.name, routing_types=args.routing_type or ["anycast"])
        print(f"created address {args.name!r}")
    elif args.action == "delete":
        _manage(args.url, "address.delete", name=args.name, force=args.force)
        print(f"deleted address {args.name!r}")
    return 0


def cmd_connection(args: argparse.Namespace) -> int:
    """`tandem connection list|close`: the ops of `GET /api/connections` and `DELETE /api/connections/{id}`."""
    if args.action == "close":
        _manage(args.url, "connection.close", id=args.id)
        print(f"closed connection {args.id}")
        return 0
    rows = _manage(args.url, "connection.list")
    if not args.json:
        for r in rows:
            r["since"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["since"])) if r["since"] else "-"
            r["user"] = r["user"] if r["user"] is not None else "-"
            r["tls"] = "yes" if r["tls"] else "no"
    _json_or_table(rows, ["id", "peer", "protocol", "user", "tls", "since", "sessions", "consumers"], args.json)
    return 0


def cmd_admin(args: argparse.Namespace) -> int:
    if args.action == "stop":
        _manage(args.url, "broker.stop", failover=args.failover)
        how = "its backup takes over" if args.failover else "clean stop, no failover"
        print(f"stopping the broker at {args.url} ({how})")
        return 0
    if args.action == "activation":
        return _admin_activation(args)
    if args.action == "status":
        status = _manage(args.url, "broker.status")
        if args.json:
            print(json.dumps(status, indent=2))
        else:
            for k, v in status.items():
                if k == "address_memory":
                    for name, row in v.items():
                        paging = "yes" if row["paging"] else "no"
                        print(
                            f"{'address':18} {name}: {row['memory_bytes']} bytes in memory, "
                            f"{row['paged_bytes']} bytes paged, paging {paging}"
                        )
                else:
                    print(f"{k:18} {v}")
    return 0


def _admin_activation(args: argparse.Namespace) -> int:
    if args.activation_action == "set":
        # The server's own claims and bumps write both copies; a value set under a running server
        # could let a stale replica activate or stop the current one: only with everything stopped.
        raise IllegalState(
            "a running server's activation sequence is not set by hand: stop both servers of the pair, "
            "then `tandem data activation set DIR VALUE --zookeeper HOSTS --node-id ID` (docs/cli.md)"
        )
    info = _manage(args.url, "broker.activation")
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"server             {info['name']} ({info['ha_policy']}, {info['state']})")
    print(f"node_id            {info['node_id']}")
    print(f"local              {info['local'] if info['local'] is not None else '-'}   ({info['data_directory']})")
    if info["coordinator"] == "none":
        print("zookeeper          -   (no [ha.coordinator])")
    else:
        zk = info["zookeeper"]
        note = f"  (claim of {-zk} in progress)" if isinstance(zk, int) and zk < 0 else ""
        print(f"zookeeper          {zk if zk is not None else '-'}{note}")
        if info.get("zookeeper_error"):
            print(f"zookeeper_error    {info['zookeeper_error']}")
        print(f"verdict            {info['verdict'] or '-'}")
        print(f"coordinator        {info['coordinator']}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from . import datatool

    if args.action == "print":
        return datatool.print_data(args.dir, records=args.records, out=sys.stdout)
    if args.action == "repair":
        return datatool.repair_data(args.dir, out=sys.stdout)
    if args.action == "activation":
        from . import activationtool

        zk = {
            "zookeeper": args.zookeeper,
            "node_id": args.node_id,
            "root": args.root,
            "connect_timeout": args.connect_timeout,
        }
        if args.activation_action == "show":
            return activationtool.show_activation(args.dir, sys.stdout, as_json=args.json, **zk)
        return activationtool.set_activation(args.dir, args.value, sys.stdout, **zk)
    return datatool.compact_data(args.dir, out=sys.stdout)


# --------------------------------------------------------------------- users
def _users_path(args: argparse.Namespace) -> Any:
    from pathlib import Path

    from .users import resolve_users_file

    if args.users_file:
        return Path(args.users_file)
    if args.config:
        import msgspec

        try:
            raw = msgspec.toml.decode(Path(args.config).read_bytes())
        except (OSError, msgspec.DecodeError) as exc:
            raise ConfigError(f"cannot read {args.config}: {exc}") from None
        value = raw.get("users-file") if isinstance(raw, dict) else None
        return resolve_users_file(value if isinstance(value, str) else None, args.config)
    return resolve_users_file(None, None)


def read_new_password(name: str) -> str:
    """From a prompt (typed twice), or from stdin when it is not a terminal: one line, or the
    same line twice. Never from the command line, where other users of the machine can see it."""
    if sys.stdin.isatty():
        import getpass

        first = getpass.getpass(f"password for {name}: ")
        if getpass.getpass("again: ") != first:
            raise InvalidArgument("the two passwords differ: nothing changed")
        password = first
    else:
        lines = sys.stdin.read().splitlines()
        if len(lines) == 2 and lines[0] != lines[1]:
            raise InvalidArgument("the two lines on stdin differ: nothing changed")
        if len(lines) not in (1, 2):
            raise InvalidArgument(f"expected the password on stdin, one line or the same line twice; got {len(lines)}")
        password = lines[0]
    if not password:
        raise InvalidArgument("an empty password is refused")
    return password


def _roles(text: str | None) -> frozenset[str]:
    from .users import check_role

    try:
        return frozenset(check_role(r.strip()) for r in text.split(",")) if text else frozenset()
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def cmd_user(args: argparse.Namespace) -> int:
    from .users import User, check_name, editing, hash_password, parse_hash, read_users

    path = _users_path(args)
    if args.action == "list":
        users = read_users(path, lenient=True) if path.exists() else {}
        rows = [
            {
                "name": n,
                "roles": ",".join(sorted(users[n].roles)),
                "password": "scrypt" if users[n].password is not None else "NOT A HASH: tandem user passwd",
            }
            for n in sorted(users)
        ]
        _json_or_table(rows, ["name", "roles", "password"], args.json)
        return 0
    try:
        name = check_name(args.name)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if args.action in ("add", "passwd"):

        def check(users: dict[str, User]) -> None:
            if args.action == "add" and name in users:
                raise InvalidArgument(f"user {name!r} exists in {path}: `tandem user passwd` or `tandem user roles`")
            if args.action == "passwd" and name not in users:
                raise InvalidArgument(f"no user {name!r} in {path}")

        check(read_users(path, lenient=True) if path.exists() else {})  # before asking for the password
        roles = _roles(args.roles) if args.action == "add" else frozenset()
        hashed = parse_hash(hash_password(read_new_password(name)))
        with editing(path) as users:  # read again under the lock: no edit of another command is lost
            check(users)
            users[name] = User(name, hashed, roles if args.action == "add" else users[name].roles)
        print(f"{'added' if args.action == 'add' else 'new password for'} user {name!r} in {path}")
        return 0
    with editing(path) as users:
        if name not in users:
            raise InvalidArgument(f"no user {name!r} in {path}")
        if args.action == "rm":
            del users[name]
        else:
            users[name] = User(name, users[name].password, _roles(args.roles), users[name].unusable)
    print(f"{'removed' if args.action == 'rm' else 'new roles for'} user {name!r} in {path}")
    return 0


def cmd_certs(args: argparse.Namespace) -> int:
    from .certs import write_dev_certs

    files = write_dev_certs(args.out)
    print(f"wrote a throwaway CA and certificates to {files.ca.parent} (NOT for production: see docs/security.md):")
    for path in (files.ca, files.server, files.server_key, files.client, files.client_key, files.ca_key):
        print(f"  {path}")
    return 0


def cmd_perf(args: argparse.Namespace) -> int:
    from . import perf

    return perf.main(args)


# -------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tandem", description="Tandem message broker")
    ap.add_argument("--version", action="version", version=f"tandem {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="start a broker")
    r.add_argument("--config", help="broker TOML file (default: built-in defaults)")
    r.add_argument("--data", help="data directory (overrides data-directory)")
    r.add_argument("--bind", help="native acceptor host:port (default 127.0.0.1:61616)")
    r.add_argument("--stomp-bind", help="also accept STOMP 1.0-1.2 on host:port (e.g. 127.0.0.1:61613)")
    r.add_argument(
        "--management-bind", help="HTTP management API on host:port (e.g. 127.0.0.1:8161; docs/management.md)"
    )
    r.add_argument("--name", help="broker name")
    r.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    r.add_argument("--quiet", action="store_true", help="do not print the start-up banner")
    r.set_defaults(func=cmd_run)

    pr = sub.add_parser("producer", help="send messages; exits non-zero unless every send was confirmed")
    _add_url(pr)
    pr.add_argument("--destination", required=True, help="address to send to")
    pr.add_argument("--count", type=int, default=1)
    pr.add_argument("--size", type=int, default=1024, help="body size in bytes")
    pr.add_argument("--text", help="send this text as the body instead of random bytes")
    pr.add_argument("--non-durable", action="store_true")
    pr.add_argument("--priority", type=int, default=4)
    pr.add_argument("--routing-type", choices=["anycast", "multicast"])
    pr.add_argument("--property", action="append", metavar="KEY=VALUE")
    pr.add_argument("--window", type=int, default=1000, help="unconfirmed sends in flight")
    pr.add_argument("--tx-batch", type=int, default=0, metavar="K", help="send in transactions of K messages")
    pr.add_argument("--dedup", metavar="PREFIX", help="give message i the dedup id PREFIX-i")
    pr.set_defaults(func=cmd_producer)

    co = sub.add_parser("consumer", help="receive messages; exits non-zero if fewer than --count arrive in time")
    _add_url(co)
    co.add_argument("--destination", required=True, help="queue to receive from")
    co.add_argument("--count", type=int, default=1)
    co.add_argument("--timeout", type=float, default=10.0, help="seconds to wait in all")
    co.add_argument("--filter", help="selector")
    co.add_argument("--print", action="store_true", help="print each body")
    co.set_defaults(func=cmd_consumer)

    q = sub.add_parser("queue", help="queue administration")
    qs = q.add_subparsers(dest="action", required=True)
    for name, hlp in (
        ("stat", "show queues"),
        ("create", "create a queue"),
        ("delete", "delete a queue"),
        ("purge", "remove every queued message"),
        ("browse", "show queued messages (memory, then pages) without consuming them"),
        ("move", "move (or --copy) queued messages to another address"),
        ("retry", "send dead letters back to their original address"),
        ("pause", "deliver nothing to the queue's consumers until resumed (kept across restarts)"),
        ("resume", "deliver again"),
    ):
        x = qs.add_parser(name, help=hlp)
        _add_url(x)
        x.add_argument("name", nargs="?" if name == "stat" else None)
        if name == "stat":
            x.add_argument("--json", action="store_true")
        if name == "create":
            x.add_argument("--address")
            x.add_argument("--routing-type", default="anycast", choices=["anycast", "multicast"])
            x.add_argument("--non-durable", action="store_true")
            x.add_argument("--filter", help="selector: only matching messages are routed to the queue")
            x.add_argument("--max-consumers", type=int, default=-1)
            x.add_argument("--exclusive", action="store_true", help="one active consumer at a time")
            x.add_argument("--last-value-key", help="property whose latest value replaces older messages")
            x.add_argument(
                "--reader-only", action="store_true", help="read by range only (Spark); ordinary consumers are refused"
            )
        if name == "delete":
            x.add_argument("--force", action="store_true", help="also when it has consumers")
        if name in ("browse", "move", "retry"):
            x.add_argument("--selector", help="only messages matching this selector")
        if name == "browse":
            x.add_argument("--count", type=int, default=20, help="messages to show (default 20, at most 1000)")
            x.add_argument("--preview", type=int, default=256, metavar="BYTES", help="body bytes shown (default 256)")
            x.add_argument("--json", action="store_true")
        if name == "move":
            x.add_argument("--to", required=True, metavar="ADDRESS", help="the address to move them to")
            x.add_argument("--copy", action="store_true", help="copy: the originals stay")
            x.add_argument("--limit", type=int, help="move at most this many")
    q.set_defaults(func=cmd_queue)

    a = sub.add_parser("address", help="address administration")
    as_ = a.add_subparsers(dest="action", required=True)
    for name in ("list", "create", "delete"):
        x = as_.add_parser(name)
        _add_url(x)
        if name != "list":
            x.add_argument("name")
        else:
            x.add_argument("--json", action="store_true")
        if name == "create":
            x.add_argument("--routing-type", action="append", choices=["anycast", "multicast"])
        if name == "delete":
            x.add_argument("--force", action="store_true", help="also delete its queues")
    a.set_defaults(func=cmd_address)

    cn = sub.add_parser("connection", help="open connections (list, close one)")
    cns = cn.add_subparsers(dest="action", required=True)
    x = cns.add_parser("list", help="every open connection: id, peer, protocol, user, TLS, since, sessions, consumers")
    _add_url(x)
    x.add_argument("--json", action="store_true")
    x = cns.add_parser("close", help="close a connection by the id `connection list` shows (its client gets an ERROR)")
    _add_url(x)
    x.add_argument("id", type=int)
    cn.set_defaults(func=cmd_connection)

    ad = sub.add_parser("admin", help="broker administration")
    ads = ad.add_subparsers(dest="action", required=True)
    st = ads.add_parser("status", help="role, state (active/passive/waiting), node id, peer, uptime, counts")
    _add_url(st)
    st.add_argument("--json", action="store_true")
    aa = ads.add_parser("activation", help="a running server's activation sequence (replication with ZooKeeper)")
    aas = aa.add_subparsers(dest="activation_action", required=True)
    x = aas.add_parser("show", help="this server's copy and ZooKeeper's value, read by the server now")
    _add_url(x)
    x.add_argument("--json", action="store_true")
    x = aas.add_parser("set", help="refused on a running server: see `tandem data activation set`")
    _add_url(x)
    x.add_argument("value", type=int)
    sp = ads.add_parser("stop", help="stop the broker cleanly (no failover), or with --failover")
    _add_url(sp)
    sp.add_argument("--failover", action="store_true", help="leave the store live so the backup takes over")
    ad.set_defaults(func=cmd_admin)

    d = sub.add_parser("data", help="inspect, compact or repair a stopped broker's data directory")
    ds = d.add_subparsers(dest="action", required=True)
    dp = ds.add_parser("print", help="dump journal files, record types and counts")
    dp.add_argument("dir")
    dp.add_argument("--records", action="store_true", help="print every live record")
    dc = ds.add_parser("compact", help="compact the journal of a stopped broker")
    dc.add_argument("dir")
    dr = ds.add_parser(
        "repair", help="cut damaged journal files at the damage (keeping a copy of each) so the broker can start"
    )
    dr.add_argument("dir")
    da = ds.add_parser("activation", help="show or set the activation sequence (replication with ZooKeeper)")
    das = da.add_subparsers(dest="activation_action", required=True)
    for name, hlp in (
        ("show", "the data directory's activation sequence and, with --zookeeper, its node id's"),
        ("set", "overwrite it (both copies with --zookeeper); can let a stale replica activate: see docs/cli.md"),
    ):
        x = das.add_parser(name, help=hlp)
        x.add_argument("dir")
        if name == "set":
            x.add_argument("value", type=int)
        else:
            x.add_argument("--json", action="store_true")
        x.add_argument("--zookeeper", metavar="HOSTS", help="ZooKeeper connect string, as [ha.coordinator] zookeeper")
        x.add_argument("--node-id", help="the pair's node id (with --zookeeper)")
        x.add_argument("--root", default="/tandem", help="as [ha.coordinator] root (default /tandem)")
        x.add_argument("--connect-timeout", type=int, default=8000, metavar="MS", help="default 8000")
    d.set_defaults(func=cmd_data)

    u = sub.add_parser(
        "user", help="users of a secured broker (the users file); a running broker picks up changes by itself"
    )
    us = u.add_subparsers(dest="action", required=True)
    for name, hlp in (
        ("add", "add a user; the password is read from a prompt, or from stdin when it is not a terminal"),
        ("passwd", "set a user's password (prompt or stdin, as for add)"),
        ("roles", "set a user's roles"),
        ("rm", "remove a user"),
        ("list", "users and their roles (never the hashes)"),
    ):
        x = us.add_parser(name, help=hlp)
        if name != "list":
            x.add_argument("name")
        if name == "add":
            x.add_argument("--roles", default="", help="comma-separated roles, e.g. producer,consumer")
        if name == "roles":
            x.add_argument("roles", help="comma-separated roles (empty string: none)")
        if name == "list":
            x.add_argument("--json", action="store_true")
        x.add_argument("--users-file", help="the users file (default: users-file of --config, else ./users.toml)")
        x.add_argument("--config", help="broker TOML file whose users file to edit (users.toml next to it by default)")
    u.set_defaults(func=cmd_user)

    ce = sub.add_parser("certs", help="TLS certificates for trials")
    ces = ce.add_subparsers(dest="action", required=True)
    cd = ces.add_parser("dev", help="a throwaway CA, a server (127.0.0.1, localhost) and a client certificate")
    cd.add_argument("--out", required=True, help="directory to write ca.pem, server.pem, client.pem and keys into")
    ce.set_defaults(func=cmd_certs)

    from . import perf
    from .chaos import run as chaos

    perf.add_parser(sub)
    chaos.add_parser(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except ConfigError as exc:
        print(f"tandem: configuration error: {exc.message}", file=sys.stderr)
        return 2
    except TandemError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
