"""Broker configuration: defaults, every documented key, and error messages that name the key and the file."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tandem.config import (
    DEFAULT_NATIVE_PORT,
    AcceptorConfig,
    AddressConfig,
    AddressSettingsConfig,
    BrokerConfig,
    CertUserMapping,
    ConnectorConfig,
    CoordinatorConfig,
    HaConfig,
    ManagementConfig,
    QueueConfig,
    load_config,
    parse_host_port,
)
from tandem.errors import ConfigError, ErrorCode

FULL = """
name = "edge-1"
data-directory = "/var/lib/tandem"
persistence-enabled = false
max-frame-size = 2097152
min-large-message-size = 262144
connection-ttl = 30000
connection-ttl-override = 45000
connection-ttl-max = 120000
connection-check-period = 500
handshake-timeout = 5000
journal-file-size = 1048576
journal-min-files = 3
journal-pool-files = 4
journal-buffer-timeout = 250000
journal-buffer-size = 8192
journal-compact-percentage = 50
journal-compact-min-files = 0
journal-datasync = false
journal-sync-non-transactional = false
persist-id-cache = false
message-expiry-scan-period = 5000
global-max-size = 104857600
global-max-messages = 500000
log-level = "debug"
memory-allocator = "malloc"
ha-policy = "shared-store-backup"
failover-on-shutdown = true
allow-failback = false
restart-backup = false
check-for-live-server = false
lock-check-period = 20
connector-ref = "me"
static-connectors = ["peer"]
cluster-user = "u"
cluster-password = "pw"
security-enabled = true
allow-insecure-network = true
max-connections-per-user = 20
max-connections-per-peer = 50
max-unacked-messages = 1000
max-unacked-bytes = 2097152
max-sessions-per-connection = 64
max-consumers-per-connection = 500
max-temporary-queues-per-connection = 100
slow-client-timeout = 5000
audit-log = true
stomp-prefetch-count = 10
network-check-list = ["10.0.0.1", "gateway.local:22", "[::1]:61616"]
network-check-period = 2000
network-check-timeout = 500
allow-uncoordinated = true
group-name = "pair-1"
backup-fsync = false
initial-replication-sync-timeout = 10000
max-saved-replicated-journal-size = 5
call-timeout = 5000
retry-replication-wait = 500
users-file = "/etc/tandem/users.toml"
security-invalidation-interval = 2000
login-failure-delay = 50
login-failure-max-delay = 1000

[[cert-user-mapping]]
user = "app"
cn = "app-client"

[[connectors]]
name = "me"
url = "127.0.0.1:7000"

[[connectors]]
name = "peer"
url = "127.0.0.1:7002"

[security-settings."orders.#"]
send = ["app"]
createDurableQueue = ["app", "ops"]

[address-settings."#"]
dead-letter-address = "DLQ"
max-delivery-attempts = 3

[address-settings."orders.*"]
auto-create-queues = false
redelivery-delay = 100
address-full-policy = "FAIL"
page-size-bytes = 1048576
page-max-cache-size = 3

[[acceptors]]
name = "main"
protocol = "native"
bind = "0.0.0.0:7000"
max-connections = 500

[[acceptors]]
name = "v6"
bind = "[::1]:7001"

[[addresses]]
name = "orders"
routing-type = "anycast"

[[addresses.queues]]
name = "orders.eu"
durable = false
filter = "region = 'eu'"
max-consumers = 4

[[addresses.queues]]
name = "orders.all"

[[addresses]]
name = "prices"
routing-type = "multicast"

[ha.coordinator]
zookeeper = "zk1:2181,zk2:2181,zk3:2181"
session-timeout = 10000
session-percent = 20
connect-timeout = 3000
root = "/brokers/tandem"

[management]
bind = "127.0.0.1:9161"
"""


def write(tmp_path: Path, text: str, name: str = "broker.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def config_error(tmp_path: Path, text: str, **overrides: object) -> tuple[str, Path]:
    """Load `text` from a file, expect a ConfigError; return its message and the file's path."""
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(p, **overrides)
    assert info.value.code == ErrorCode.CONFIG
    return str(info.value), p


def kebab_names(cls: type[msgspec.Struct]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(cls)}


# ------------------------------------------------------------------- loading
def test_defaults_without_a_file() -> None:
    """No file is a working single broker: every default, one native acceptor on localhost."""
    cfg = load_config()
    assert cfg == BrokerConfig()
    assert cfg.acceptors == [AcceptorConfig()]
    assert cfg.acceptor("native") == AcceptorConfig(
        name="native", protocol="native", bind=f"127.0.0.1:{DEFAULT_NATIVE_PORT}"
    )
    assert cfg.journal_file_size == 10 * 1024 * 1024
    assert cfg.journal_compact_percentage == 30
    assert cfg.persistence_enabled and cfg.journal_datasync
    assert cfg.journal_dir == Path("./data") / "journal"
    assert cfg.bindings_dir == Path("./data") / "bindings"
    assert cfg.effective_ttl_ms == cfg.connection_ttl == 60_000


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    """Every default, the users file's path made relative to the file's directory."""
    beside = BrokerConfig(users_file=str(tmp_path / "users.toml"))
    assert load_config(write(tmp_path, "")) == beside
    assert load_config(str(write(tmp_path, "# only a comment\n"))) == beside


TLS_KEYS = {
    "ssl-enabled",
    "cert-path",
    "key-path",
    "trust-store-path",
    "need-client-auth",
    "enabled-protocols",
    "enabled-cipher-suites",
}


def test_full_file_covers_and_loads_every_documented_key(tmp_path: Path) -> None:
    """A file using every key of every config struct loads, and each value lands in its field."""
    cfg = load_config(write(tmp_path, FULL))
    top = {line.split("=")[0].strip() for line in FULL.splitlines() if "=" in line and not line.startswith(" ")}
    assert kebab_names(BrokerConfig) <= top | {
        "acceptors",
        "addresses",
        "address-settings",
        "security-settings",
        "connectors",
        "cert-user-mapping",
        "ha",
        "management",  # tests/unit/test_management_config.py
    }
    assert kebab_names(HaConfig) == {"coordinator"}
    assert kebab_names(CoordinatorConfig) <= top
    assert kebab_names(AcceptorConfig) == {
        "name",
        "protocol",
        "bind",
        "max-connections",
        *TLS_KEYS,
    }  # TLS: tests/unit/test_tls_config.py
    assert kebab_names(AddressConfig) == {"name", "routing-type", "queues"}
    assert kebab_names(QueueConfig) == {"name", "durable", "filter", "max-consumers"}

    assert cfg == BrokerConfig(
        name="edge-1",
        data_directory="/var/lib/tandem",
        persistence_enabled=False,
        acceptors=[
            AcceptorConfig(name="main", protocol="native", bind="0.0.0.0:7000", max_connections=500),
            AcceptorConfig(name="v6", bind="[::1]:7001"),
        ],
        addresses=[
            AddressConfig(
                name="orders",
                routing_type="anycast",
                queues=[
                    QueueConfig(name="orders.eu", durable=False, filter="region = 'eu'", max_consumers=4),
                    QueueConfig(name="orders.all"),
                ],
            ),
            AddressConfig(name="prices", routing_type="multicast"),
        ],
        max_frame_size=2 * 1024 * 1024,
        min_large_message_size=256 * 1024,
        connection_ttl=30_000,
        connection_ttl_override=45_000,
        connection_ttl_max=120_000,
        connection_check_period=500,
        handshake_timeout=5000,
        journal_file_size=1024 * 1024,
        journal_min_files=3,
        journal_pool_files=4,
        journal_buffer_timeout=250_000,
        journal_buffer_size=8192,
        journal_compact_percentage=50,
        journal_compact_min_files=0,
        journal_datasync=False,
        journal_sync_non_transactional=False,
        address_settings={
            "#": AddressSettingsConfig(dead_letter_address="DLQ", max_delivery_attempts=3),
            "orders.*": AddressSettingsConfig(
                auto_create_queues=False,
                redelivery_delay=100,
                address_full_policy="FAIL",
                page_size_bytes=1048576,
                page_max_cache_size=3,
            ),
        },
        persist_id_cache=False,
        message_expiry_scan_period=5000,
        global_max_size=104857600,
        global_max_messages=500000,
        log_level="debug",
        memory_allocator="malloc",
        ha_policy="shared-store-backup",
        failover_on_shutdown=True,
        allow_failback=False,
        restart_backup=False,
        check_for_live_server=False,
        lock_check_period=20,
        connectors=[ConnectorConfig("me", "127.0.0.1:7000"), ConnectorConfig("peer", "127.0.0.1:7002")],
        connector_ref="me",
        static_connectors=["peer"],
        cluster_user="u",
        cluster_password="pw",
        security_enabled=True,
        users_file="/etc/tandem/users.toml",
        security_invalidation_interval=2000,
        login_failure_delay=50,
        login_failure_max_delay=1000,
        allow_insecure_network=True,
        max_connections_per_user=20,
        max_connections_per_peer=50,
        max_unacked_messages=1000,
        max_unacked_bytes=2097152,
        max_sessions_per_connection=64,
        max_consumers_per_connection=500,
        max_temporary_queues_per_connection=100,
        slow_client_timeout=5000,
        audit_log=True,
        security_settings={"orders.#": {"send": ["app"], "createDurableQueue": ["app", "ops"]}},
        cert_user_mapping=[CertUserMapping("app", cn="app-client")],
        stomp_prefetch_count=10,
        network_check_list=["10.0.0.1", "gateway.local:22", "[::1]:61616"],
        network_check_period=2000,
        network_check_timeout=500,
        ha=HaConfig(
            coordinator=CoordinatorConfig(
                zookeeper="zk1:2181,zk2:2181,zk3:2181",
                session_timeout=10_000,
                session_percent=20,
                connect_timeout=3000,
                root="/brokers/tandem",
            )
        ),
        allow_uncoordinated=True,
        group_name="pair-1",
        backup_fsync=False,
        initial_replication_sync_timeout=10_000,
        max_saved_replicated_journal_size=5,
        call_timeout=5000,
        retry_replication_wait=500,
        management=ManagementConfig(bind="127.0.0.1:9161"),
    )
    # Every field differs from its default, so none of them was silently ignored.
    default = BrokerConfig()
    for f in msgspec.structs.fields(BrokerConfig):
        assert getattr(cfg, f.name) != getattr(default, f.name), f.encode_name
    assert cfg.effective_ttl_ms == 45_000
    assert cfg.data_path == Path("/var/lib/tandem")


def test_config_is_frozen(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, FULL))
    with pytest.raises(AttributeError):
        cfg.name = "other"  # type: ignore[misc]


def test_overrides_apply_over_the_file(tmp_path: Path) -> None:
    """snake_case keyword overrides replace file values; None means 'not given'."""
    p = write(tmp_path, 'name = "from-file"\njournal-file-size = 1048576\n')
    cfg = load_config(p, journal_file_size=2 * 1024 * 1024, data_directory="/tmp/x", name=None)
    assert cfg.journal_file_size == 2 * 1024 * 1024
    assert cfg.data_directory == "/tmp/x"
    assert cfg.name == "from-file"
    assert load_config(None, persistence_enabled=False, log_level="info").persistence_enabled is False


# -------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('ha-policy = "replication-primary"\npersistence-enabled = false\n', "persistence-enabled"),
        ('ha-policy = "replication-backup"\n', "static-connectors"),
        ("max-saved-replicated-journal-size = -2\n", "max-saved-replicated-journal-size"),
        ("call-timeout = 0\n", "call-timeout"),
    ],
)
def test_replication_settings_that_cannot_work_are_refused(tmp_path: Path, text: str, needle: str) -> None:
    """A replicated store needs persistence, a backup needs to know its primary; bounds are checked."""
    msg, _p = config_error(tmp_path, text)
    assert needle in msg


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    msg, p = config_error(tmp_path, 'name = "x"\njournal-fiel-size = 1048576\n')
    assert "journal-fiel-size" in msg
    assert str(p) in msg


def test_ill_typed_value_names_key_and_file(tmp_path: Path) -> None:
    msg, p = config_error(tmp_path, 'journal-file-size = "big"\n')
    assert "journal-file-size" in msg
    assert str(p) in msg


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("journal-datasync = 1", "journal-datasync"),
        ('check-for-live-server = "yes"', "check-for-live-server"),
        ("allow-failback = 0", "allow-failback"),
        ("restart-backup = []", "restart-backup"),
        ('log-level = "trace"', "log-level"),
        ('memory-allocator = "tcmalloc"', "memory-allocator"),
        ('default-routing-type = "broadcast"', "default-routing-type"),
        ("acceptors = 3", "acceptors"),
        ("max-frame-size = 1.5", "max-frame-size"),
    ],
)
def test_other_type_errors_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    msg, p = config_error(tmp_path, text + "\n")
    assert key in msg
    assert str(p) in msg


@pytest.mark.parametrize(
    ("text", "path", "key"),
    [
        ('[[acceptors]]\nname = "a"\nbogus = 1\n', "acceptors[0]", "bogus"),
        ('[[acceptors]]\nname = "a"\n[[acceptors]]\nname = "b"\nport = 1\n', "acceptors[1]", "port"),
        ('[[acceptors]]\nprotocol = "amqp"\n', "acceptors[0].protocol", "amqp"),
        (
            '[[addresses]]\nname = "a"\n[[addresses.queues]]\nname = "q"\nextra = true\n',
            "addresses[0].queues[0]",
            "extra",
        ),
        ('[[addresses]]\nname = "a"\n[[addresses.queues]]\nname = "q"\nmax-consumers = "many"\n', "max-consumers", ""),
        ('[[addresses]]\nrouting-type = "anycast"\n', "addresses[0]", "name"),
    ],
    ids=["acceptor-unknown", "second-acceptor-unknown", "acceptor-protocol", "queue-unknown", "queue-type", "missing"],
)
def test_nested_errors_name_the_path(tmp_path: Path, text: str, path: str, key: str) -> None:
    msg, p = config_error(tmp_path, text)
    assert path in msg
    assert key in msg
    assert str(p) in msg


@pytest.mark.parametrize("bind", ["localhost", "1.2.3.4", ":8080", "h:99999", "h:port", "a b:1", "h:123456", ""])
def test_bad_bind_names_the_key(tmp_path: Path, bind: str) -> None:
    msg, p = config_error(tmp_path, f'[[acceptors]]\nname = "main"\nbind = "{bind}"\n')
    assert "bind" in msg
    assert "main" in msg
    assert str(p) in msg


@pytest.mark.parametrize(
    ("bind", "expected"),
    [("0.0.0.0:0", ("0.0.0.0", 0)), ("[::1]:61616", ("::1", 61616)), ("broker.local:65535", ("broker.local", 65535))],
)
def test_good_bind_values(tmp_path: Path, bind: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(bind) == expected
    # (network addresses need allow-insecure-network with security off: tested below)
    cfg = load_config(write(tmp_path, f'allow-insecure-network = true\n[[acceptors]]\nbind = "{bind}"\n'))
    assert cfg.acceptors[0].bind == bind


@pytest.mark.parametrize(
    "text",
    [
        "journal-compact-percentage = 150",
        "journal-compact-percentage = -1",
        "journal-file-size = 1024",
        "journal-min-files = 0",
        "journal-pool-files = -1",
        "journal-buffer-size = 100",
        "max-frame-size = 10",
        "min-large-message-size = 1000",
        "connection-ttl = 5",
        "connection-check-period = 1",
        "default-consumer-window-size = -5",
    ],
)
def test_out_of_range_values_name_the_key(tmp_path: Path, text: str) -> None:
    msg, p = config_error(tmp_path, text + "\n")
    assert text.split(" = ")[0] in msg
    assert str(p) in msg


def test_minimums_are_inclusive(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "journal-file-size = 65536\njournal-compact-percentage = 100\n"))
    assert cfg.journal_file_size == 65536 and cfg.journal_compact_percentage == 100


def test_an_acceptor_without_bind_listens_on_its_protocols_port(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, '[[acceptors]]\nname = "n"\n[[acceptors]]\nname = "s"\nprotocol = "stomp"\n'))
    assert [(a.name, a.bind) for a in cfg.acceptors] == [
        ("n", f"127.0.0.1:{DEFAULT_NATIVE_PORT}"),
        ("s", "127.0.0.1:61613"),
    ]


def test_duplicate_acceptor_names_are_refused(tmp_path: Path) -> None:
    msg, p = config_error(tmp_path, '[[acceptors]]\nbind = "h:1"\n[[acceptors]]\nbind = "h:2"\n')
    assert "acceptor" in msg and "unique" in msg
    assert str(p) in msg


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    msg, p = config_error(tmp_path, "name = = 1\n")
    assert str(p) in msg
    assert "TOML" in msg


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert str(p) in str(info.value)


def test_bad_overrides_are_config_errors(tmp_path: Path) -> None:
    """Overrides go through the same validation as file values."""
    msg, _ = config_error(tmp_path, "", journal_file_size=10)
    assert "journal-file-size" in msg
    msg, _ = config_error(tmp_path, "", journal_compact_percentage="half")
    assert "journal-compact-percentage" in msg
    msg, _ = config_error(tmp_path, "", no_such_setting=1)
    assert "no-such-setting" in msg


@pytest.mark.parametrize("path", sorted(str(p) for p in (Path(__file__).parents[2] / "examples").rglob("*.toml")))
def test_every_shipped_example_config_loads(path: str) -> None:
    """README and docs point users at these files: each must start a broker as it is."""
    cfg = load_config(path)
    assert cfg.acceptors, path


@pytest.mark.parametrize(
    "text",
    [
        "security-enabled = true\n",  # cluster-password left at its built-in default
        'security-enabled = true\ncluster-password = "change me"\n',
        'security-enabled = true\ncluster-password = ""\n',
        'security-enabled = true\ncluster-password = "   "\n',
        'security-enabled = true\ncluster-user = "me"\n',
    ],
)
def test_security_refuses_a_builtin_or_empty_cluster_password(tmp_path: Path, text: str) -> None:
    """Anyone knows the built-in pair: with security on it would let a stranger in as the cluster user."""
    msg, p = config_error(tmp_path, text)
    assert "cluster-password" in msg and "cluster-user" in msg and "security-enabled" in msg
    assert str(p) in msg


def test_security_accepts_a_cluster_password_of_ones_own(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, 'security-enabled = true\ncluster-password = "s3cret pair"\n'))
    assert cfg.security_enabled and cfg.cluster_password == "s3cret pair"
    # Without security the default is harmless (every connection is accepted anyway).
    assert load_config(write(tmp_path, "security-enabled = false\n")).cluster_password == "change me"


def test_connection_limit_keys() -> None:
    """`handshake-timeout` and `connection-ttl-max` (see tests/integration/test_connection_limits.py)."""
    cfg = load_config(None)
    assert cfg.handshake_timeout == 10_000
    assert cfg.connection_ttl <= cfg.connection_ttl_max
    cfg = load_config(None, handshake_timeout=300, connection_ttl=1000, connection_ttl_max=1000)
    assert (cfg.handshake_timeout, cfg.connection_ttl_max) == (300, 1000)
    with pytest.raises(ConfigError, match="connection-ttl-max"):
        load_config(None, connection_ttl=60_000, connection_ttl_max=30_000)
    with pytest.raises(ConfigError, match="handshake-timeout"):
        load_config(None, handshake_timeout=0)


def test_failback_defaults() -> None:
    """A restarted primary looks for a server active with its node id (unlike Artemis's default),
    fails back to it, and the server that stepped down becomes a backup again."""
    cfg = load_config(None)
    assert (cfg.check_for_live_server, cfg.allow_failback, cfg.restart_backup) == (True, True, True)


# ------------------------------------------------- coordinator and network check
def test_coordinator_and_network_check_defaults() -> None:
    """No coordinator unless `[ha.coordinator]` is given; Artemis's session (18 s) and connection (8 s) times."""
    cfg = load_config(None)
    assert cfg.ha.coordinator is None
    assert (cfg.network_check_list, cfg.network_check_period, cfg.network_check_timeout) == ([], 5000, 1000)
    c = CoordinatorConfig(zookeeper="127.0.0.1:2181")
    assert (c.session_timeout, c.session_percent, c.connect_timeout, c.root) == (18_000, 25, 8000, "/tandem")


def test_a_coordinator_table_with_only_its_connect_string(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, '[ha.coordinator]\nzookeeper = "127.0.0.1:2181"\n'))
    assert cfg.ha.coordinator == CoordinatorConfig(zookeeper="127.0.0.1:2181")


@pytest.mark.parametrize(
    "zookeeper", ["zk1:2181,zk2:2181/brokers", "[::1]:2181", "127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183"]
)
def test_good_zookeeper_connect_strings(tmp_path: Path, zookeeper: str) -> None:
    cfg = load_config(write(tmp_path, f'[ha.coordinator]\nzookeeper = "{zookeeper}"\n'))
    assert cfg.ha.coordinator is not None and cfg.ha.coordinator.zookeeper == zookeeper


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("session-timeout = 10000\n", "zookeeper"),  # the connect string is required
        ('zookeeper = ""\n', "zookeeper"),
        ('zookeeper = "zk1"\n', "zookeeper"),
        ('zookeeper = "zk1:2181,"\n', "zookeeper"),
        ('zookeeper = "zk1:2181,zk2"\n', "zookeeper"),
        ('zookeeper = "zk1:99999"\n', "zookeeper"),
        ('zookeeper = "zk1:2181/"\n', "zookeeper"),
        ('zookeeper = "h:1"\nsession-timeout = 500\n', "session-timeout"),
        ('zookeeper = "h:1"\nsession-percent = 34\n', "session-percent"),
        ('zookeeper = "h:1"\nsession-percent = -1\n', "session-percent"),
        ('zookeeper = "h:1"\nconnect-timeout = 0\n', "connect-timeout"),
        ('zookeeper = "h:1"\nroot = "tandem"\n', "root"),
        ('zookeeper = "h:1"\nroot = "/"\n', "root"),
        ('zookeeper = "h:1"\nroot = "/a/"\n', "root"),
        ('zookeeper = "h:1"\nroot = "/a//b"\n', "root"),
        ('zookeeper = "h:1"\nsession-ms = 1\n', "session-ms"),
        ('zookeeper = "h:1"\nsession-timeout = "long"\n', "session-timeout"),
    ],
)
def test_bad_coordinator_settings_name_the_key(tmp_path: Path, table: str, key: str) -> None:
    msg, p = config_error(tmp_path, "[ha.coordinator]\n" + table)
    assert key in msg
    assert "ha.coordinator" in msg
    assert str(p) in msg


def test_an_unknown_ha_table_is_refused(tmp_path: Path) -> None:
    msg, _ = config_error(tmp_path, "[ha.quorum]\nsize = 3\n")
    assert "quorum" in msg and "ha" in msg


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('network-check-list = ["a b"]', "network-check-list"),
        ('network-check-list = ["h:port"]', "network-check-list"),
        ('network-check-list = ["h:70000"]', "network-check-list"),
        ('network-check-list = [""]', "network-check-list"),
        ('network-check-list = "10.0.0.1"', "network-check-list"),
        ("network-check-period = 0", "network-check-period"),
        ("network-check-timeout = 0", "network-check-timeout"),
    ],
)
def test_bad_network_check_settings_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    msg, p = config_error(tmp_path, text + "\n")
    assert key in msg
    assert str(p) in msg


def test_global_max_size_defaults_to_a_quarter_of_physical_memory() -> None:
    from tandem.core.address import physical_memory

    assert BrokerConfig().effective_global_max_size == physical_memory() // 4 > 0
    assert BrokerConfig(global_max_size=-1).memory_limits().limited is False
    limits = BrokerConfig(global_max_size=-1, global_max_messages=3).memory_limits()
    assert limits.limited and not limits.full
    limits.changed(10, 3)
    assert limits.full


@pytest.mark.parametrize(
    ("key", "value"),
    [("page-size-bytes", 10), ("page-max-cache-size", 0)],
)
def test_bad_page_settings_are_refused(tmp_path: Path, key: str, value: int) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(write(tmp_path, f'[address-settings."#"]\n{key} = {value}\n'))


def test_users_in_the_broker_config_are_refused_with_where_they_went(tmp_path: Path) -> None:
    """Users moved to the users file (decision 0059): plain-text passwords in broker.toml are not read."""
    text = '[[users]]\nname = "app"\npassword = "secret"\n[[users]]\nname = "ops"\npassword = "x"\nroles = ["a"]\n'
    msg, _ = config_error(tmp_path, text)
    assert "'app', 'ops'" in msg and "users file" in msg and "tandem user add" in msg, msg
    assert "secret" not in msg


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, "users.toml"), ("u/users.toml", "u/users.toml"), ("/abs/users.toml", "/abs/users.toml")],
)
def test_the_users_file_is_found_beside_the_config(tmp_path: Path, value: str | None, expected: str) -> None:
    text = f'users-file = "{value}"\n' if value else ""
    cfg = load_config(write(tmp_path, text))
    assert cfg.users_file == str(tmp_path / expected)
    assert load_config().users_file == "users.toml"  # no file: the current directory


# ------------------------------------------------------- safe defaults (decision 0062)
@pytest.mark.parametrize("bind", ["0.0.0.0:61616", "[::]:61616", "10.1.2.3:61616", "broker.example:61616"])
@pytest.mark.parametrize("protocol", ["native", "stomp"])
def test_a_network_bind_without_security_is_refused(tmp_path: Path, bind: str, protocol: str) -> None:
    """Any acceptor (STOMP too) on a non-loopback address with security off: the message names the
    acceptor and the keys that make it start."""
    text = (
        '[[acceptors]]\nname = "local"\nbind = "127.0.0.1:61616"\n'
        f'[[acceptors]]\nname = "lan"\nprotocol = "{protocol}"\nbind = "{bind}"\n'
    )
    msg, _p = config_error(tmp_path, text)
    assert "'lan'" in msg and bind in msg
    assert "allow-insecure-network" in msg and "security-enabled" in msg


@pytest.mark.parametrize("bind", ["0.0.0.0:61616", "[::]:61616", "10.1.2.3:61616"])
def test_a_network_bind_is_accepted_with_security_or_allow_insecure_network(tmp_path: Path, bind: str) -> None:
    acceptor = f'[[acceptors]]\nname = "lan"\nbind = "{bind}"\n'
    assert load_config(write(tmp_path, "allow-insecure-network = true\n" + acceptor)).allow_insecure_network
    secured = 'security-enabled = true\ncluster-password = "mine"\n' + acceptor
    assert load_config(write(tmp_path, secured)).acceptors[0].bind == bind


@pytest.mark.parametrize("bind", ["127.0.0.1:0", "127.3.4.5:61616", "[::1]:61616", "localhost:61616"])
def test_loopback_binds_need_nothing(tmp_path: Path, bind: str) -> None:
    assert load_config(write(tmp_path, f'[[acceptors]]\nname = "a"\nbind = "{bind}"\n')).acceptors[0].bind == bind


def test_safe_default_keys() -> None:
    cfg = BrokerConfig()
    assert cfg.allow_insecure_network is False and cfg.audit_log is False
    assert (cfg.max_connections_per_user, cfg.max_connections_per_peer) == (-1, -1)
    assert (cfg.max_unacked_messages, cfg.max_unacked_bytes) == (100_000, 100 * 1024 * 1024)
    assert cfg.slow_client_timeout == 30_000
    assert cfg.acceptors[0].max_connections is None
