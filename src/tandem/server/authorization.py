"""Which permission a management operation needs, and a connection's `Access` (decision 0060).

The decisions themselves live in core/permissions.py; this module maps the server's operations
onto them. With security off a connection has no `Access` and nothing is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.permissions import MANAGEMENT_ADDRESS, Access, Authorizer, Permission
from ..core.postoffice import PostOffice
from .security import Subject


def access_for(authorizer: Authorizer | None, subject: Subject, peer: str = "?") -> Access | None:
    """None when security is off. The cluster subject (server-to-server links) holds no role: it
    may announce itself and replicate (each checks the cluster pair on its own), nothing else."""
    if authorizer is None:
        return None
    return Access(authorizer, subject.user, frozenset() if subject.cluster else subject.roles, peer)


# Read-only management operations need `view` (or `manage`), the others `edit` (or `manage`).
VIEW_OPS = frozenset(
    {
        "queue.stat",
        "queue.list",
        "queue.browse",
        "address.list",
        "connection.list",
        "consumer.list",
        "broker.status",
        "broker.overview",
        "broker.ha",
        "broker.journal",
        "broker.activation",
        "tx.status",
    }
)
EDIT_OPS = frozenset(
    {"queue.purge", "broker.stop", "connection.close", "queue.move", "queue.retry", "queue.pause", "queue.resume"}
)
# Operations on one named queue: checked on the queue's address (queue.move also on its target).
QUEUE_OPS = frozenset(
    {"queue.stat", "queue.purge", "queue.browse", "queue.move", "queue.retry", "queue.pause", "queue.resume"}
)
# What a client's session does through MANAGE: checked as Artemis checks a session's create/delete.
RESOURCE_OPS = frozenset({"queue.create", "queue.delete", "address.create", "address.delete"})
OPEN_OPS = frozenset({"cluster.announce"})
_USES_QUEUE = (
    Permission.CONSUME,
    Permission.SEND,
    Permission.BROWSE,
    Permission.CREATE_DURABLE_QUEUE,
    Permission.CREATE_NON_DURABLE_QUEUE,
)  # carries and checks the cluster pair itself


def authorize_management(access: Access, postoffice: Callable[[], PostOffice], op: str, args: dict[str, Any]) -> None:
    """Raise Unauthorized unless `access` may run `op` with `args` (already type-checked);
    `postoffice` is called only for operations on a queue or address (they need an active server)."""
    if op in OPEN_OPS:
        return
    name = args.get("name")
    if op in RESOURCE_OPS:
        _authorize_resource(access, postoffice(), op, args)
        return
    if op in QUEUE_OPS and isinstance(name, str):
        q = postoffice().queues.get(name)
        address = q.address if q is not None else name
    else:
        address = MANAGEMENT_ADDRESS
    access.check_management(op not in VIEW_OPS, address)
    to = args.get("to")
    if op == "queue.move" and isinstance(to, str) and to:
        access.check_management(True, to)


def _authorize_resource(access: Access, po: PostOffice, op: str, args: dict[str, Any]) -> None:
    name = args["name"] if isinstance(args.get("name"), str) else ""
    if op == "address.create":
        access.check(Permission.CREATE_ADDRESS, name)
    elif op == "address.delete":
        access.check(Permission.DELETE_ADDRESS, name)
    elif op == "queue.delete":
        q = po.queues.get(name)
        if q is None:
            # Its name stands for its address (as for queue.stat): only who may delete queues there
            # learns that it does not exist; anyone else is refused as for an existing queue.
            if not access.allowed(Permission.DELETE_NON_DURABLE_QUEUE, name):
                access.check(Permission.DELETE_DURABLE_QUEUE, name)
            return  # the operation answers QueueDoesNotExist
        durable = q.durable and not q.temporary
        access.check(Permission.DELETE_DURABLE_QUEUE if durable else Permission.DELETE_NON_DURABLE_QUEUE, q.address)
    else:  # queue.create: only what would be created is checked (exists-ok on an existing queue creates nothing)
        address = args.get("address") or name
        existing = po.queues.get(name)
        if args.get("exists_ok") and existing is not None:
            # It answers the queue's state: only to a user who may use the queue or make queues there.
            if not any(access.allowed(perm, existing.address) for perm in _USES_QUEUE):
                access.check(Permission.CREATE_DURABLE_QUEUE, existing.address)
            return
        durable = args.get("durable", True) and not args.get("temporary", False)
        access.check(Permission.CREATE_DURABLE_QUEUE if durable else Permission.CREATE_NON_DURABLE_QUEUE, address)
        if address not in po.addresses:
            access.check(Permission.CREATE_ADDRESS, address)
