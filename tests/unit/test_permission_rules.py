"""core/permissions.py: matching, both spellings, the cache and the denial log."""

from __future__ import annotations

import logging

import pytest

from tandem.config import load_config
from tandem.core.permissions import Access, Authorizer, Permission, SecurityRepository
from tandem.errors import ConfigError, Unauthorized

APP = frozenset({"app"})


def test_the_most_specific_pattern_decides_alone() -> None:
    repo = SecurityRepository(
        {
            "#": {"send": ["app"], "consume": ["app"]},
            "orders.#": {"send": ["app"]},
            "orders.eu.*": {"consume": ["app"]},
            "orders.eu.de": {"browse": ["app"]},
        }
    )
    assert repo.granted(APP, "other") == {Permission.SEND, Permission.CONSUME}
    assert repo.granted(APP, "orders") == {Permission.SEND}  # `#` matches zero words
    assert repo.granted(APP, "orders.us.x") == {Permission.SEND}
    assert repo.granted(APP, "orders.eu.fr") == {Permission.CONSUME}  # nothing from orders.#
    assert repo.granted(APP, "orders.eu.de") == {Permission.BROWSE}  # the exact name beats `*`
    assert repo.granted(frozenset({"other"}), "other") == frozenset()
    assert SecurityRepository({}).granted(APP, "x") == frozenset()  # no pattern: nothing allowed


def test_kebab_case_and_artemis_camel_case_are_both_accepted() -> None:
    repo = SecurityRepository({"a": {"createDurableQueue": ["r"], "delete-non-durable-queue": ["r"]}})
    assert repo.granted(frozenset({"r"}), "a") == {Permission.CREATE_DURABLE_QUEUE, Permission.DELETE_NON_DURABLE_QUEUE}
    assert Permission.CREATE_NON_DURABLE_QUEUE.artemis == "createNonDurableQueue"
    with pytest.raises(ValueError, match="unknown permission 'sned'"):
        SecurityRepository({"a": {"sned": ["r"]}})
    with pytest.raises(ValueError, match="wildcards must be whole words"):
        SecurityRepository({"a.b#": {"send": ["r"]}})


def test_a_bad_security_setting_stops_start_up(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match=r"security-settings: unknown permission 'sendd'"):
        load_config(None, security_settings={"#": {"sendd": ["r"]}})


def test_decisions_are_cached_until_the_settings_change() -> None:
    auth = Authorizer(SecurityRepository({"#": {"send": ["app"]}}))
    assert auth.allowed(APP, Permission.SEND, "q")
    auth.repository = SecurityRepository({})  # without reload: the cached decision stands
    assert auth.allowed(APP, Permission.SEND, "q")
    auth.reload(SecurityRepository({}))
    assert not auth.allowed(APP, Permission.SEND, "q")


def test_a_denial_names_permission_and_address_and_is_logged_once_per_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    access = Access(Authorizer(SecurityRepository({"#": {"consume": ["app"]}})), "alice", APP)
    access.check(Permission.CONSUME, "q")
    with caplog.at_level(logging.WARNING, logger="tandem.security"):
        for _ in range(100):
            with pytest.raises(Unauthorized, match=r"user 'alice' does not have permission 'send' on address 'q'"):
                access.check(Permission.SEND, "q")
        with pytest.raises(Unauthorized, match="'manage' or 'edit'"):
            access.check_management(True, "tandem.management")
    lines = [r.getMessage() for r in caplog.records if "permission denied" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "'send' on address 'q'" in lines[0]
