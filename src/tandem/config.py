"""Broker configuration: TOML → frozen, validated structs with Artemis's names in kebab-case.

Every key has a default, so an empty file (or none) is a working single broker.
Unknown or ill-typed keys stop start-up with a message naming the key and file.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec

from .errors import ConfigError

if TYPE_CHECKING:
    from .core.address import MemoryLimits
    from .core.permissions import SecurityRepository
    from .core.settings import SettingsRepository

KiB = 1024
MiB = 1024 * KiB

DEFAULT_NATIVE_PORT = 61616
DEFAULT_STOMP_PORT = 61613
# Before its handshake is accepted a connection may send frames of this size at most (decision 0021).
HANDSHAKE_FRAME_LIMIT = 64 * KiB
DEFAULT_CLUSTER_USER = "tandem.cluster"
DEFAULT_CLUSTER_PASSWORD = "change me"  # refused with security-enabled: everyone knows it

RoutingTypeName = Literal["anycast", "multicast"]
TLS_PROTOCOLS = ("TLSv1.2", "TLSv1.3")  # older ones are broken: not offered


class _Conf(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="kebab"):
    pass


class AcceptorConfig(_Conf, frozen=True):
    """A listening socket: `bind` is host:port; `protocol` native or stomp (1.0/1.1/1.2)."""

    name: str = "native"
    protocol: Literal["native", "stomp"] = "native"
    bind: str | None = None  # None → the protocol's default port on 127.0.0.1 (61616 native, 61613 STOMP)
    # TLS (server/tls.py, docs/security.md "TLS"): PEM files, reloaded when they change or on SIGHUP.
    ssl_enabled: bool = False
    cert_path: str | None = None
    key_path: str | None = None
    trust_store_path: str | None = None  # CAs for client certificates (asked for, checked if sent)
    need_client_auth: bool = False  # a client without a certificate from trust-store-path is refused
    enabled_protocols: list[str] = msgspec.field(default_factory=lambda: list(TLS_PROTOCOLS))
    enabled_cipher_suites: list[str] = []  # OpenSSL names, TLS 1.2 only ([]: Python's defaults)
    # Open connections at most (Artemis's `connectionsAllowed`); None → derived from the file-descriptor
    # limit (server/limits.py, docs/security.md "Safe defaults and connection limits").
    max_connections: int | None = None

    def __post_init__(self) -> None:
        if self.bind is None:
            port = DEFAULT_STOMP_PORT if self.protocol == "stomp" else DEFAULT_NATIVE_PORT
            msgspec.structs.force_setattr(self, "bind", f"127.0.0.1:{port}")
        if self.ssl_enabled and not (self.cert_path and self.key_path):
            raise ValueError(f"acceptor {self.name!r}: `ssl-enabled` needs `cert-path` and `key-path`")
        if self.need_client_auth and not (self.ssl_enabled and self.trust_store_path):
            raise ValueError(f"acceptor {self.name!r}: `need-client-auth` needs `ssl-enabled` and `trust-store-path`")
        bad = [p for p in self.enabled_protocols if p not in TLS_PROTOCOLS]
        if bad or not self.enabled_protocols:
            raise ValueError(
                f"acceptor {self.name!r}: `enabled-protocols` takes {', '.join(TLS_PROTOCOLS)} (got {bad or '[]'})"
            )
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"acceptor {self.name!r}: `max-connections` must be >= 1, got {self.max_connections}")

    @property
    def host_port(self) -> str:
        """`bind`, filled in from the protocol's default when the file left it out."""
        assert self.bind is not None  # set by __post_init__
        return self.bind


def check_metrics_queues(pattern: str) -> None:
    """Raise ValueError unless `pattern` is "" (no per-queue series) or a valid wildcard pattern."""
    if pattern == "":
        return
    for word in pattern.split("."):
        if word == "" or (("#" in word or "*" in word) and len(word) > 1):
            raise ValueError(f"[management] `metrics-queues` {pattern!r}: wildcards (`#`, `*`) must be whole words")


DEFAULT_MANAGEMENT_BIND = "127.0.0.1:8161"  # Artemis's console port


class ManagementConfig(_Conf, frozen=True):
    """The `[management]` table: the HTTP management listener (docs/management.md). Present: on.

    Its TLS keys are an acceptor's, read and reloaded the same way (server/tls.py)."""

    bind: str = DEFAULT_MANAGEMENT_BIND
    ssl_enabled: bool = False
    cert_path: str | None = None
    key_path: str | None = None
    trust_store_path: str | None = None
    need_client_auth: bool = False
    enabled_protocols: list[str] = msgspec.field(default_factory=lambda: list(TLS_PROTOCOLS))
    enabled_cipher_suites: list[str] = []
    session_timeout: int = 1_800_000  # ms a console login lasts without a request
    # Queues that get series of their own on /metrics: an address-settings style pattern on the
    # queue name ("#" all, "" none; temporary queues never), docs/metrics.md "Cardinality".
    metrics_queues: str = "#"

    def __post_init__(self) -> None:
        try:
            parse_host_port(self.bind)
        except ValueError as exc:
            raise ValueError(f"[management] `bind` {exc}") from None
        check_metrics_queues(self.metrics_queues)
        if self.session_timeout < 1000:
            raise ValueError(f"[management] `session-timeout` must be >= 1000, got {self.session_timeout}")
        try:
            self.tls_acceptor()
        except ValueError as exc:
            raise ValueError(str(exc).replace("acceptor 'management'", "[management]")) from None

    def tls_acceptor(self) -> AcceptorConfig:
        """Its TLS settings as an acceptor's, for server/tls.py (which reads only those)."""
        return AcceptorConfig(
            name="management",
            bind=self.bind,
            ssl_enabled=self.ssl_enabled,
            cert_path=self.cert_path,
            key_path=self.key_path,
            trust_store_path=self.trust_store_path,
            need_client_auth=self.need_client_auth,
            enabled_protocols=self.enabled_protocols,
            enabled_cipher_suites=self.enabled_cipher_suites,
        )


class QueueConfig(_Conf, frozen=True):
    name: str
    durable: bool = True
    filter: str | None = None
    max_consumers: int = -1


class AddressConfig(_Conf, frozen=True):
    """A pre-declared address and its queues (Artemis `<addresses>`)."""

    name: str
    routing_type: RoutingTypeName = "anycast"
    queues: list[QueueConfig] = []


class AddressSettingsConfig(_Conf, frozen=True):
    """One `[address-settings."pattern"]` table: only the keys it sets take part in the merge."""

    auto_create_queues: bool | None = None
    auto_create_addresses: bool | None = None
    auto_delete_queues: bool | None = None
    auto_delete_addresses: bool | None = None
    default_address_routing_type: RoutingTypeName | None = None
    default_queue_routing_type: RoutingTypeName | None = None
    dead_letter_address: str | None = None
    expiry_address: str | None = None
    expiry_delay: int | None = None
    max_delivery_attempts: int | None = None
    redelivery_delay: int | None = None
    redelivery_delay_multiplier: float | None = None
    max_redelivery_delay: int | None = None
    default_consumer_window_size: int | None = None
    id_cache_size: int | None = None
    max_size_bytes: int | None = None
    address_full_policy: Literal["PAGE", "BLOCK", "FAIL", "DROP"] | None = None
    page_size_bytes: int | None = None
    page_max_cache_size: int | None = None
    default_last_value_key: str | None = None
    default_exclusive_queue: bool | None = None

    def __post_init__(self) -> None:
        for name in ("max_delivery_attempts", "id_cache_size"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"`{name.replace('_', '-')}` must be >= 0")
        for name in ("redelivery_delay", "default_consumer_window_size"):
            v = getattr(self, name)
            if v is not None and v < -1:
                raise ValueError(f"`{name.replace('_', '-')}` must be >= -1")
        if self.page_size_bytes is not None and self.page_size_bytes < 1024:
            raise ValueError("`page-size-bytes` must be >= 1024")
        if self.page_max_cache_size is not None and self.page_max_cache_size < 1:
            raise ValueError("`page-max-cache-size` must be >= 1")
        if self.redelivery_delay_multiplier is not None and self.redelivery_delay_multiplier < 1.0:
            raise ValueError("`redelivery-delay-multiplier` must be >= 1.0")

    def values(self) -> dict[str, object]:
        """The keys this table sets, as core settings values."""
        from .core.message import RoutingType

        out: dict[str, object] = {}
        for name in self.__struct_fields__:
            v = getattr(self, name)
            if v is None:
                continue
            if name.startswith("default_") and name.endswith("_routing_type"):
                v = RoutingType.parse(v)
            out[name] = v
        return out


class ConnectorConfig(_Conf, frozen=True):
    """Where to reach a server: this one (`connector-ref`) or a peer (`static-connectors`)."""

    name: str
    url: str  # host:port (or tcp://host:port); tcps://host:port: TLS
    # For this server's own links to the connector (announcements, replication); never told to clients.
    trust_store_path: str | None = None  # CAs to check the peer's certificate with (None: the system's)
    cert_path: str | None = None  # this server's certificate, for a peer that needs client auth
    key_path: str | None = None
    verify_host: bool = True  # the peer's certificate must name the connector's host

    def link_options(self) -> dict[str, object]:
        """Client options for a server link to this connector (client/options.py)."""
        _, _, tls = split_connector(self.url)
        if not tls:
            return {}
        return {
            "ssl": True,
            "ca": self.trust_store_path,
            "cert": self.cert_path,
            "key": self.key_path,
            "verify_host": self.verify_host,
        }


HaPolicyName = Literal[
    "live-only", "shared-store-primary", "shared-store-backup", "replication-primary", "replication-backup"
]
REPLICATION_POLICIES = ("replication-primary", "replication-backup")

_ZNODE_PATH = re.compile(r"^(?:/[^/\s]+)+$")


class CoordinatorConfig(_Conf, frozen=True):
    """`[ha.coordinator]`: ZooKeeper decides which server of a replicated pair may be active (docs/ha.md).

    Times in ms. `session-timeout` and `connect-timeout` are Artemis's `session-ms` and
    `connection-ms` (same defaults). A server whose connection stays suspended for
    `session-percent` % of the session counts its session as lost and stops serving; the
    client notices a silent server only after 2/3 of the session, so the sum must stay under
    the session for the server to stop before ZooKeeper lets the peer take over (decision 0031).
    """

    zookeeper: str  # connect string: host:port[,host:port...][/chroot]
    session_timeout: int = 18_000
    session_percent: int = 25
    connect_timeout: int = 8_000
    root: str = "/tandem"  # znodes live under <root>/<node id>/

    def __post_init__(self) -> None:
        servers, slash, chroot = self.zookeeper.partition("/")
        if not servers.strip():
            raise ValueError(f"`zookeeper` must list host:port[,host:port...], got {self.zookeeper!r}")
        for server in servers.split(","):
            try:
                parse_host_port(server)
            except ValueError as exc:
                raise ValueError(f"`zookeeper` {exc} (in {self.zookeeper!r})") from None
        if slash and not _ZNODE_PATH.match("/" + chroot):
            raise ValueError(f"`zookeeper`: bad chroot path in {self.zookeeper!r}")
        if self.session_timeout < 1000:
            raise ValueError(f"`session-timeout` must be >= 1000, got {self.session_timeout}")
        if not 0 <= self.session_percent <= 33:
            raise ValueError(
                f"`session-percent` must be between 0 and 33, got {self.session_percent}: with more, a server "
                "cut off from ZooKeeper could serve on after its session expired and its peer took over"
            )
        if self.connect_timeout < 100:
            raise ValueError(f"`connect-timeout` must be >= 100, got {self.connect_timeout}")
        if not _ZNODE_PATH.match(self.root):
            raise ValueError(f"`root` must be a ZooKeeper path like /tandem (no trailing slash), got {self.root!r}")


class CertUserMapping(_Conf, frozen=True):
    """`[[cert-user-mapping]]`: a verified client certificate whose subject matches logs in as `user`
    without a password. `cn` matches the common name exactly; `subject` is a regular expression
    that must match the whole RFC 4514 subject (e.g. `CN=app-1,O=Example`)."""

    user: str
    cn: str | None = None
    subject: str | None = None

    def __post_init__(self) -> None:
        if (self.cn is None) == (self.subject is None):
            raise ValueError(f"cert-user-mapping for {self.user!r}: set one of `cn` or `subject`")
        if self.subject is not None:
            try:
                re.compile(self.subject)
            except re.error as exc:
                raise ValueError(f"cert-user-mapping for {self.user!r}: bad `subject` regex: {exc}") from None

    def matches(self, cn: str | None, subject: str) -> bool:
        if self.cn is not None:
            return cn == self.cn
        assert self.subject is not None
        return re.fullmatch(self.subject, subject) is not None


class HaConfig(_Conf, frozen=True):
    """The `[ha]` table; the policy itself is the top-level `ha-policy`."""

    coordinator: CoordinatorConfig | None = None


class BrokerConfig(_Conf, frozen=True):
    name: str = "tandem"
    data_directory: str = "./data"
    persistence_enabled: bool = True
    acceptors: list[AcceptorConfig] = msgspec.field(default_factory=lambda: [AcceptorConfig()])
    addresses: list[AddressConfig] = []

    # Who may connect.
    security_enabled: bool = False
    # Users and password hashes (tandem/users.py, `tandem user`); load_config makes a relative
    # path relative to the config file's directory (without a file: the current directory).
    users_file: str = "users.toml"
    security_invalidation_interval: int = 10_000  # ms between checks of the users file for changes
    login_failure_delay: int = 100  # ms a peer waits before its next login after one failure, doubled per failure
    login_failure_max_delay: int = 5_000  # ms: the most a peer waits between failed logins
    # Per-address permissions (Artemis's security-settings): pattern -> permission -> roles; see
    # core/permissions.py. Checked only with security-enabled.
    security_settings: dict[str, dict[str, list[str]]] = {}
    cert_user_mapping: list[CertUserMapping] = []  # mutual TLS: certificate subject -> user (first match)
    # Safe defaults (docs/security.md, decision 0062): an acceptor on a non-loopback address with
    # security off stops start-up unless this is true.
    allow_insecure_network: bool = False
    max_connections_per_user: int = -1  # logged-in connections of one user (security on); -1: no limit
    max_connections_per_peer: int = -1  # connections from one client IP address; -1: no limit
    # Per connection, across its consumers: deliveries not acknowledged yet; once over, it gets no more
    # until it acknowledges (-1: no limit).
    max_unacked_messages: int = 100_000
    max_unacked_bytes: int = 100 * MiB
    # What one connection may open: sessions; consumers and browsers (STOMP subscriptions); the
    # temporary queues it made (each holds memory for as long as the connection lives).
    max_sessions_per_connection: int = 1024
    max_consumers_per_connection: int = 10_000
    max_temporary_queues_per_connection: int = 10_000
    # A connection that takes none of its pending output (4 MiB queued) for this long is cut (ms).
    slow_client_timeout: int = 30_000
    audit_log: bool = False  # one line per login, creation, deletion, purge, management operation
    management: ManagementConfig | None = None  # the HTTP management listener; None: off

    # STOMP: credit per subscription (messages) when SUBSCRIBE has no prefetch-count header.
    stomp_prefetch_count: int = 256

    # Wire limits and liveness.
    max_frame_size: int = 100 * MiB
    # Large messages (docs/storage.md): a STOMP body over this is streamed into a file under
    # large-messages/; also the size of the chunks the broker delivers a large message in. Native
    # clients decide for themselves (their `min_large_message_size` option), as in Artemis.
    min_large_message_size: int = 100 * KiB
    connection_ttl: int = 60_000
    connection_ttl_override: int = -1
    connection_ttl_max: int = 300_000  # the longest TTL (or heart-beat) a client may ask for
    connection_check_period: int = 2_000
    handshake_timeout: int = 10_000  # for HELLO or CONNECT to be accepted (Artemis's, in seconds there)

    # Journal (DESIGN.md §4).
    journal_file_size: int = 10 * MiB
    journal_min_files: int = 2
    journal_pool_files: int = 10
    journal_buffer_timeout: int = 0  # decision 0016
    journal_buffer_size: int = 490 * KiB
    journal_compact_percentage: int = 30
    journal_compact_min_files: int = 10
    journal_datasync: bool = True
    journal_sync_non_transactional: bool = True

    # High availability (Artemis's ha-policy with a shared store).
    ha_policy: HaPolicyName = "live-only"
    failover_on_shutdown: bool = False
    allow_failback: bool = True  # a primary back in sync asks for its node back; the active server hands it over
    restart_backup: bool = True  # a server that handed its node back becomes a backup again (else it stops)
    lock_check_period: int = 50  # ms between attempts at a lock held by another server
    connectors: list[ConnectorConfig] = []
    connector_ref: str | None = None  # this server's connector, told to clients (default: its native acceptor)
    static_connectors: list[str] = []  # peers a waiting server announces itself to
    cluster_user: str = DEFAULT_CLUSTER_USER
    cluster_password: str = DEFAULT_CLUSTER_PASSWORD
    ha: HaConfig = HaConfig()
    # Hosts (or host:port) one of which a server must reach to activate and to stay active (ha/network_check.py).
    network_check_list: list[str] = []
    network_check_period: int = 5_000  # Artemis's code default (its docs say 10000)
    network_check_timeout: int = 1_000

    # Replication (docs/ha.md, "Replicated pair"): each server has its own data directory.
    allow_uncoordinated: bool = False  # run a replicated pair without a coordinator (split brain possible)
    group_name: str | None = None  # a backup pairs only with a primary of the same group
    backup_fsync: bool = True  # (primary) a confirmation waits for the backup's disk, not only its memory
    initial_replication_sync_timeout: int = 30_000  # ms for each step of the initial sync's hand-over
    max_saved_replicated_journal_size: int = 2  # oldreplica.N directories a backup keeps (-1: all)
    call_timeout: int = 30_000  # ms a primary waits for its backup's acknowledgement before dropping it
    retry_replication_wait: int = 2_000  # ms before a backup tries its primary again
    # (primary) At start, look for a server active with this node id and sync from it as a backup
    # (Artemis's check-for-live-server, default false there: a stale primary would serve again).
    check_for_live_server: bool = True

    # Per-address behaviour (Artemis's address-settings), matched by pattern; see core/settings.py.
    address_settings: dict[str, AddressSettingsConfig] = {}
    persist_id_cache: bool = True
    # What all addresses together may hold in memory (docs/configuration.md): bytes (None: a quarter
    # of the machine's physical memory) and messages; -1: no limit.
    global_max_size: int | None = None
    global_max_messages: int = -1
    message_expiry_scan_period: int = 30_000

    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    # The allocator `tandem run` starts the broker with (server/allocator.py, decision 0083).
    memory_allocator: Literal["python", "mimalloc", "malloc"] = "python"

    def __post_init__(self) -> None:
        _check_positive(self, "journal_file_size", minimum=64 * KiB)
        _check_positive(self, "journal_min_files", minimum=1)
        _check_positive(self, "journal_pool_files", minimum=0)
        _check_positive(self, "journal_buffer_timeout", minimum=0)
        _check_positive(self, "journal_buffer_size", minimum=4 * KiB)
        _check_positive(self, "journal_compact_min_files", minimum=0)
        _check_positive(self, "max_frame_size", minimum=1 * KiB)
        _check_positive(self, "min_large_message_size", minimum=1 * KiB)
        _check_positive(self, "connection_ttl", minimum=100)
        _check_positive(self, "connection_check_period", minimum=10)
        _check_positive(self, "connection_ttl_max", minimum=100)
        _check_positive(self, "handshake_timeout", minimum=100)
        if self.connection_ttl > self.connection_ttl_max:
            raise ValueError(
                f"`connection-ttl` ({self.connection_ttl}) must not exceed "
                f"`connection-ttl-max` ({self.connection_ttl_max})"
            )
        _check_positive(self, "message_expiry_scan_period", minimum=-1)
        _check_positive(self, "global_max_messages", minimum=-1)
        if self.global_max_size is not None:
            _check_positive(self, "global_max_size", minimum=-1)
        from .core.settings import check_pattern

        for pattern in self.address_settings:
            try:
                check_pattern(pattern)
            except ValueError as exc:
                raise ValueError(f"address-settings: {exc}") from None
        self.security_repository()  # unknown permissions and bad patterns stop start-up
        if not 0 <= self.journal_compact_percentage <= 100:
            raise ValueError("`journal-compact-percentage` must be between 0 and 100")
        _check_positive(self, "lock_check_period", minimum=1)
        _check_positive(self, "network_check_period", minimum=10)
        _check_positive(self, "network_check_timeout", minimum=10)
        for target in self.network_check_list:
            try:
                parse_check_target(target)
            except ValueError as exc:
                raise ValueError(f"`network-check-list` entry {exc}") from None
        if self.security_enabled and self.cluster_password.strip() in ("", DEFAULT_CLUSTER_PASSWORD):
            # The cluster pair logs in like a user: its built-in value would let anyone in.
            raise ValueError(
                "`security-enabled` is true but `cluster-password` is empty or the built-in "
                f"{DEFAULT_CLUSTER_PASSWORD!r}, so anyone could log in as `cluster-user` ({self.cluster_user!r}): "
                "set `cluster-user` and `cluster-password` to a pair of your own (the same on both servers of a pair)"
            )
        _check_positive(self, "security_invalidation_interval", minimum=100)
        _check_positive(self, "login_failure_delay", minimum=0)
        _check_positive(self, "login_failure_max_delay", minimum=0)
        _check_positive(self, "stomp_prefetch_count", minimum=0)
        _check_positive(self, "max_connections_per_user", minimum=-1)
        _check_positive(self, "max_connections_per_peer", minimum=-1)
        _check_positive(self, "max_unacked_messages", minimum=-1)
        _check_positive(self, "max_unacked_bytes", minimum=-1)
        _check_positive(self, "max_sessions_per_connection", minimum=1)
        _check_positive(self, "max_consumers_per_connection", minimum=1)
        _check_positive(self, "max_temporary_queues_per_connection", minimum=1)
        _check_positive(self, "slow_client_timeout", minimum=100)
        _check_positive(self, "initial_replication_sync_timeout", minimum=100)
        _check_positive(self, "call_timeout", minimum=100)
        _check_positive(self, "retry_replication_wait", minimum=10)
        _check_positive(self, "max_saved_replicated_journal_size", minimum=-1)
        if self.ha_policy in REPLICATION_POLICIES and not self.persistence_enabled:
            raise ValueError(f"`ha-policy = {self.ha_policy!r}` replicates the store: it needs `persistence-enabled`")
        if self.ha_policy == "replication-backup" and not self.static_connectors:
            raise ValueError(
                "`ha-policy = 'replication-backup'` needs `static-connectors` naming the primary it replicates"
            )
        known = {c.name for c in self.connectors}
        for c in self.connectors:
            try:
                split_connector(c.url)
            except ValueError as exc:
                raise ValueError(f"connector {c.name!r}: `url` {exc}") from None
        for ref in [*([self.connector_ref] if self.connector_ref else []), *self.static_connectors]:
            if ref not in known:
                raise ValueError(f"connector {ref!r} is not defined in [[connectors]]")
        names = [a.name for a in self.acceptors]
        if len(set(names)) != len(names):
            raise ValueError("acceptor names must be unique")
        for acc in self.acceptors:
            try:
                parse_host_port(acc.host_port)
            except ValueError as exc:
                raise ValueError(f"acceptor {acc.name!r}: `bind` {exc}") from None
        check_network_exposure(self)

    # Derived values -------------------------------------------------------
    @property
    def data_path(self) -> Path:
        return Path(self.data_directory)

    @property
    def journal_dir(self) -> Path:
        return self.data_path / "journal"

    @property
    def bindings_dir(self) -> Path:
        return self.data_path / "bindings"

    @property
    def effective_ttl_ms(self) -> int:
        return self.connection_ttl_override if self.connection_ttl_override > 0 else self.connection_ttl

    def connector_url(self, name: str) -> str:
        """host:port, or tcps://host:port for a TLS connector (the form topologies carry)."""
        host, port, tls = split_connector(self.connector(name).url)
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return f"tcps://{where}" if tls else where

    def connector(self, name: str) -> ConnectorConfig:
        for c in self.connectors:
            if c.name == name:
                return c
        raise KeyError(name)

    def link_options(self, url: str) -> dict[str, object]:
        """TLS client options for a server link to `url` (a connector_url): its connector's."""
        for c in self.connectors:
            if self.connector_url(c.name) == url:
                return c.link_options()
        return {}

    @property
    def effective_global_max_size(self) -> int:
        """`global-max-size`, its default (a quarter of physical memory) filled in."""
        if self.global_max_size is not None:
            return self.global_max_size
        from .core.address import default_global_max_size

        return default_global_max_size()

    def memory_limits(self) -> MemoryLimits:
        from .core.address import MemoryLimits

        return MemoryLimits(self.effective_global_max_size, self.global_max_messages)

    def settings_repository(self) -> SettingsRepository:
        from .core.settings import SettingsRepository

        return SettingsRepository({p: s.values() for p, s in self.address_settings.items()})

    def security_repository(self) -> SecurityRepository:
        from .core.permissions import SecurityRepository

        try:
            return SecurityRepository(self.security_settings)
        except ValueError as exc:
            raise ValueError(f"security-settings: {exc}") from None

    def acceptor(self, protocol: str) -> AcceptorConfig | None:
        for acc in self.acceptors:
            if acc.protocol == protocol:
                return acc
        return None


def is_loopback_host(host: str) -> bool:
    """Whether a bind host reaches only this machine: a loopback IP or `localhost`. Any other
    name counts as a network address (what it resolves to can change)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_network_exposure(cfg: BrokerConfig) -> None:
    """With security off, every acceptor must be on loopback unless `allow-insecure-network`:
    anyone who reaches the port could do everything, management included (decision 0062)."""
    if cfg.security_enabled or cfg.allow_insecure_network:
        return
    for acc in cfg.acceptors:
        host, _ = parse_host_port(acc.host_port)
        if not is_loopback_host(host):
            raise ValueError(
                f"acceptor {acc.name!r} binds {acc.host_port}, a network address, and `security-enabled` is "
                "false: anyone who reaches it could send, consume, delete queues and stop the broker. Turn "
                "security on (`security-enabled = true`), bind a loopback address (127.0.0.1, ::1), or set "
                "`allow-insecure-network = true` to accept the risk"
            )
    if cfg.management is not None and not is_loopback_host(parse_host_port(cfg.management.bind)[0]):
        raise ValueError(
            f"[management] binds {cfg.management.bind}, a network address, and `security-enabled` is false: "
            "anyone who reaches it could purge queues and close connections without logging in. Turn security "
            "on, bind a loopback address (127.0.0.1, ::1), or set `allow-insecure-network = true` to accept the risk"
        )


def _check_positive(cfg: BrokerConfig, attr: str, minimum: int) -> None:
    value = getattr(cfg, attr)
    if value < minimum:
        key = attr.replace("_", "-")
        raise ValueError(f"`{key}` must be >= {minimum}, got {value}")


_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:]+)\]|(?P<host>[^:\s/]+)):(?P<port>\d{1,5})$")


def parse_host_port(text: str) -> tuple[str, int]:
    """Parse `host:port` (or `[v6]:port`); raises ValueError with a readable reason."""
    m = _HOST_PORT.match(text.strip())
    if not m:
        raise ValueError(f"must look like host:port, got {text!r}")
    port = int(m.group("port"))
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range in {text!r}")
    return (m.group("v6") or m.group("host")), port


def split_connector(text: str) -> tuple[str, int, bool]:
    """`host:port`, `tcp://host:port` or `tcps://host:port` (TLS) → host, port, TLS."""
    t = text.strip()
    tls = t.startswith("tcps://")
    if tls:
        t = t[len("tcps://") :]
    elif t.startswith("tcp://"):
        t = t[len("tcp://") :]
    host, port = parse_host_port(t)
    return host, port, tls


def parse_check_target(text: str) -> tuple[str, int | None]:
    """A `network-check-list` entry: host, [v6]:port, host:port or a bare IPv6 address (no port)."""
    text = text.strip()
    if text.count(":") > 1 and not text.startswith("["):
        host, port = text, None  # a bare IPv6 address
    elif ":" in text:
        try:
            return parse_host_port(text)
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from None
    else:
        host, port = text, None
    if not host or any(c.isspace() or c in "/[]" for c in host):
        raise ValueError(f"{text!r} must look like host or host:port")
    return host, port


def load_config(path: str | Path | None = None, **overrides: object) -> BrokerConfig:
    """Read a TOML file (or defaults) and apply keyword overrides (snake_case names)."""
    raw: dict[str, object] = {}
    where = "<defaults>"
    if path is not None:
        where = str(path)
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {where}: {exc.strerror}") from None
        try:
            raw = msgspec.toml.decode(data)
        except msgspec.DecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    for key, value in overrides.items():
        if value is not None:
            raw[key.replace("_", "-")] = value
    if "users" in raw:  # where users were before the users file (decision 0059)
        users = raw["users"]
        listed = ", ".join(repr(u.get("name")) for u in users if isinstance(u, dict)) if isinstance(users, list) else ""
        raise ConfigError(
            f"{where}: `[[users]]` ({listed}) is no longer read from the broker config: users and their password "
            "hashes live in the users file (`users-file`, default users.toml next to the config). Move each with "
            f"`tandem user add NAME --roles R1,R2 --config {where}`, then delete the `[[users]]` tables"
        )
    try:
        cfg = msgspec.convert(raw, type=BrokerConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {_describe(exc)}") from None
    if path is None:
        return cfg
    from .users import resolve_users_file

    return msgspec.structs.replace(cfg, users_file=str(resolve_users_file(cfg.users_file, path)))


def _describe(exc: msgspec.ValidationError) -> str:
    """Make msgspec's `... - at `$.a[0].b`` read as a key name."""
    text = str(exc)
    m = re.match(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", text, re.S)
    if not m or not m.group("path"):
        return text
    key = m.group("path").lstrip(".")
    return f"key `{key}`: {m.group('what')}"
