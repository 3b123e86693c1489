"""Address settings: wildcard matching, precedence and merging."""

from __future__ import annotations

import pytest

from tandem.core.settings import AddressSettings, SettingsRepository, words_match


@pytest.mark.parametrize(
    ("pattern", "address", "expected"),
    [
        ("#", "", True),
        ("#", "a.b.c", True),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("a.#", "b.a", False),
        ("a.*", "a", False),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("*.b", "a.b", True),
        ("a.#.z", "a.z", True),
        ("a.#.z", "a.b.c.z", True),
        ("a.#.z", "a.b.c", False),
        ("a.b", "a.b", True),
        ("a.b", "a.bc", False),
    ],
)
def test_wildcards(pattern: str, address: str, expected: bool) -> None:
    words = tuple(address.split(".")) if address else ()
    assert words_match(tuple(pattern.split(".")), words) is expected


def test_most_specific_wins_and_unset_keys_fall_through() -> None:
    repo = SettingsRepository(
        {
            "#": {"max_delivery_attempts": 3, "dead_letter_address": "DLQ", "redelivery_delay": 5},
            "orders.#": {"max_delivery_attempts": 7},
            "orders.*": {"redelivery_delay": 50},
            "orders.eu": {"dead_letter_address": "EU.DLQ"},
        }
    )
    eu = repo.match("orders.eu")
    assert (eu.max_delivery_attempts, eu.redelivery_delay, eu.dead_letter_address) == (7, 50, "EU.DLQ")
    us = repo.match("orders.us")
    assert (us.max_delivery_attempts, us.redelivery_delay, us.dead_letter_address) == (7, 50, "DLQ")
    deep = repo.match("orders.us.west")
    assert (deep.max_delivery_attempts, deep.redelivery_delay) == (7, 5)
    other = repo.match("billing")
    assert (other.max_delivery_attempts, other.id_cache_size) == (3, AddressSettings().id_cache_size)


def test_no_patterns_means_defaults() -> None:
    assert SettingsRepository().match("anything") == AddressSettings()


@pytest.mark.parametrize("bad", ["", "a..b", "a.b#", "*x", "a.#b"])
def test_bad_patterns_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        SettingsRepository({bad: {"max_delivery_attempts": 1}})


def test_unknown_setting_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown address setting"):
        SettingsRepository({"#": {"no_such_thing": 1}})


def test_redelivery_delay_grows_and_is_capped() -> None:
    s = AddressSettings(redelivery_delay=100, redelivery_delay_multiplier=2.0, max_redelivery_delay=500)
    assert [s.redelivery_delay_for(n) for n in (1, 2, 3, 4, 5)] == [100, 200, 400, 500, 500]
    default_cap = AddressSettings(redelivery_delay=100, redelivery_delay_multiplier=3.0)
    assert default_cap.redelivery_delay_for(10) == 1000  # ten times the delay, as Artemis
    assert AddressSettings().redelivery_delay_for(4) == 0


def test_addresses_matching_the_same_patterns_share_one_settings_object() -> None:
    """Nothing is kept per address name: a broker that made a million temporary queues holds
    one settings object per set of matching patterns, not one per queue it ever made."""
    repo = SettingsRepository({"#": {"max_delivery_attempts": 3}, "orders.*": {"redelivery_delay": 5}})
    names = [f"tmp.{i}" for i in range(10_000)]
    first = {id(repo.match(n)) for n in names}
    assert len(first) == 1
    assert repo.match("orders.eu") is repo.match("orders.us")
    assert repo.match("orders.eu") is not repo.match("tmp.0")
    assert repo.match("orders.eu").redelivery_delay == 5
    assert repo.match("orders.eu").max_delivery_attempts == 3
