"""The `[management]` table and `--management-bind` (docs/configuration.md "Management")."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tandem.config import DEFAULT_MANAGEMENT_BIND, ManagementConfig, load_config
from tandem.errors import ConfigError

TLS_KEYS = {
    "ssl-enabled",
    "cert-path",
    "key-path",
    "trust-store-path",
    "need-client-auth",
    "enabled-protocols",
    "enabled-cipher-suites",
}


def load(tmp_path: Path, text: str) -> ManagementConfig | None:
    p = tmp_path / "b.toml"
    p.write_text(text)
    return load_config(p).management


def test_off_without_the_table_and_on_at_the_default_with_it(tmp_path: Path) -> None:
    assert load(tmp_path, "") is None
    m = load(tmp_path, "[management]\n")
    assert m is not None and m.bind == DEFAULT_MANAGEMENT_BIND == "127.0.0.1:8161"
    assert not m.ssl_enabled and m.session_timeout == 1_800_000


def test_keys_are_an_acceptors_tls_keys_and_a_few_more() -> None:
    names = {f.encode_name for f in msgspec.structs.fields(ManagementConfig)}
    assert TLS_KEYS <= names
    assert names - TLS_KEYS <= {"bind", "session-timeout", "metrics-queues"}


def test_every_key_loads(tmp_path: Path) -> None:
    m = load(
        tmp_path,
        'security-enabled = true\ncluster-password = "x-secret"\n[management]\nbind = "0.0.0.0:9000"\n'
        'ssl-enabled = true\ncert-path = "c.pem"\nkey-path = "k.pem"\ntrust-store-path = "ca.pem"\n'
        'need-client-auth = true\nenabled-protocols = ["TLSv1.3"]\n'
        'enabled-cipher-suites = ["ECDHE-RSA-AES256-GCM-SHA384"]\n'
        "session-timeout = 60000\n",
    )
    assert m == ManagementConfig(
        bind="0.0.0.0:9000",
        ssl_enabled=True,
        cert_path="c.pem",
        key_path="k.pem",
        trust_store_path="ca.pem",
        need_client_auth=True,
        enabled_protocols=["TLSv1.3"],
        enabled_cipher_suites=["ECDHE-RSA-AES256-GCM-SHA384"],
        session_timeout=60_000,
    )
    acc = m.tls_acceptor()
    assert (acc.cert_path, acc.key_path, acc.trust_store_path) == ("c.pem", "k.pem", "ca.pem")
    assert acc.need_client_auth and acc.ssl_enabled


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ('bind = "nowhere"', ["[management]", "bind", "host:port"]),
        ("ssl-enabled = true", ["[management]", "cert-path"]),
        ('need-client-auth = true\nssl-enabled = true\ncert-path = "c"\nkey-path = "k"', ["trust-store-path"]),
        ("session-timeout = 10", ["session-timeout", ">= 1000"]),
        ('bind = "0.0.0.0:8161"', ["[management]", "0.0.0.0:8161", "security-enabled", "allow-insecure-network"]),
        ("colour = 1", ["colour"]),
    ],
)
def test_bad_values_stop_start_up_naming_the_key(tmp_path: Path, table: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, f"[management]\n{table}\n")
    for w in words:
        assert w in info.value.message, info.value.message


def test_a_network_address_with_security_off_and_allow_insecure_network(tmp_path: Path) -> None:
    m = load(tmp_path, 'allow-insecure-network = true\n[management]\nbind = "0.0.0.0:8161"\n')
    assert m is not None and m.bind == "0.0.0.0:8161"
