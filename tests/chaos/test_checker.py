"""The total-queue checker on hand-written histories: each verdict category, both modes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tandem.chaos import checker, history


def ev(ev: str, *vs: str, p: str = "x", **fields: Any) -> dict[str, Any]:
    return {"t": 0.0, "ev": ev, "p": p, "vs": list(vs), **fields}


def sent(*vs: str) -> list[dict[str, Any]]:
    return [ev("attempt", *vs), ev("ok", *vs, lat=0.01)]


def consumed(*vs: str) -> list[dict[str, Any]]:
    return [ev("deliver", *vs, ack="tx"), ev("ack", *vs)]


def test_a_clean_history_is_valid() -> None:
    v = checker.check([*sent("a", "b"), *consumed("a"), *consumed("b")])
    assert v["valid"] and v["confirmed"] == 2 and v["delivered"] == 2 and v["acknowledged"] == 2
    assert (v["lost"], v["duplicated"], v["unexpected"], v["recovered"]) == (0, 0, 0, 0)


def test_a_confirmed_value_never_delivered_is_lost() -> None:
    v = checker.check([*sent("a", "b"), *consumed("a")])
    assert not v["valid"] and v["lost"] == 1 and v["samples"]["lost"] == ["b"]


def test_a_delivery_whose_acknowledgement_was_refused_and_never_came_again_is_lost() -> None:
    rolled_back = [ev("deliver", "a", ack="tx"), ev("ack-fail", "a", err="TRANSACTION_ROLLED_BACK")]
    v = checker.check([*sent("a"), *rolled_back])
    assert not v["valid"] and v["lost"] == 1 and v["never_delivered"] == 0
    stale = [ev("deliver", "b", ack="client"), ev("ack-fail", "b", err="STALE_ACKNOWLEDGE")]
    assert checker.check([*sent("b"), *stale])["lost"] == 1
    # consumed all the same: an auto-acknowledged delivery, or an acknowledgement of unknown outcome
    assert checker.check([*sent("c"), ev("deliver", "c", ack="auto")])["lost"] == 0
    assert checker.check([*sent("d"), ev("deliver", "d", ack="tx"), ev("ack-info", "d")])["lost"] == 0


def test_an_unconfirmed_value_never_delivered_is_not_lost() -> None:
    v = checker.check([ev("attempt", "a"), ev("info", "a", err="UNBLOCKED")])
    assert v["valid"] and v["lost"] == 0 and v["unknown"] == 1 and v["unknown_not_delivered"] == 1


def test_two_confirmed_acknowledgements_of_one_value_are_a_duplicate() -> None:
    v = checker.check([*sent("a"), *consumed("a"), *consumed("a")])
    assert not v["valid"] and v["duplicated"] == 1 and v["samples"]["duplicated"] == ["a"]


def test_a_redelivery_after_an_unconfirmed_acknowledgement_is_not_a_duplicate() -> None:
    # an auto-acknowledged delivery before a failover, the same value again to a transacted consumer
    v = checker.check([*sent("a"), ev("deliver", "a", ack="auto"), *consumed("a")])
    assert v["valid"] and v["duplicated"] == 0 and v["redelivered"] == 1
    # a rolled-back consumer transaction: delivered twice, acknowledged once
    v = checker.check([*sent("b"), ev("deliver", "b", ack="tx"), ev("ack-fail", "b"), *consumed("b")])
    assert v["valid"] and v["redelivered"] == 1


def test_a_value_never_sent_is_unexpected() -> None:
    v = checker.check([*sent("a"), *consumed("a"), *consumed("zz")])
    assert not v["valid"] and v["unexpected"] == 1 and v["samples"]["unexpected"] == ["zz"]


def test_a_delivered_value_of_a_rolled_back_transaction_is_unexpected() -> None:
    v = checker.check([ev("attempt", "a", "b"), ev("fail", "a", "b", err="TRANSACTION_ROLLED_BACK"), *consumed("a")])
    assert not v["valid"] and v["unexpected"] == 1 and v["aborted_reads"] == 1


def test_a_value_that_failed_then_went_through_on_a_retry_is_confirmed() -> None:
    v = checker.check([ev("attempt", "a"), ev("fail", "a"), *sent("a"), *consumed("a")])
    assert v["valid"] and v["failed"] == 0 and v["confirmed"] == 1


def test_an_unknown_outcome_that_was_delivered_is_recovered() -> None:
    v = checker.check([ev("attempt", "a"), ev("info", "a", err="CALL_TIMEOUT"), *consumed("a")])
    assert v["valid"] and v["recovered"] == 1 and v["unknown"] == 1 and v["samples"]["recovered"] == ["a"]


def test_an_unknown_outcome_later_confirmed_is_confirmed_not_recovered() -> None:
    v = checker.check([ev("attempt", "a"), ev("info", "a"), ev("attempt", "a"), ev("ok", "a"), *consumed("a")])
    assert v["valid"] and v["unknown"] == 0 and v["recovered"] == 0 and v["retried"] == 1


def test_at_least_once_mode_reports_duplicates_without_failing() -> None:
    events = [*sent("a"), *consumed("a"), *consumed("a")]
    v = checker.check(events, mode="at-least-once")
    assert v["valid"] and v["duplicated"] == 1 and v["duplicated_not_sent_twice"] == 1
    resent = [ev("attempt", "b"), ev("info", "b"), *sent("b"), *consumed("b"), *consumed("b")]
    v = checker.check(resent, mode="at-least-once")
    assert v["duplicated"] == 1 and v["duplicated_not_sent_twice"] == 0  # two copies: explained
    assert not checker.check([*sent("a", "b"), *consumed("a")], mode="at-least-once")["valid"]  # still lost


def test_faults_are_counted_and_the_summary_names_what_failed() -> None:
    events = [
        ev("fault", p="n", kind="kill", target="primary"),
        ev("healed", p="n", kind="kill"),
        ev("fault", p="n", kind="zombie", target="backup"),
        *sent("a", "b"),
        *consumed("a"),
    ]
    v = checker.check(events)
    assert v["faults"] == 2 and v["healed"] == 1 and v["fault_kinds"] == {"kill": 1, "zombie": 1}
    assert [f["kind"] for f in v["fault_log"]] == ["kill", "zombie"] and "heal_s" in v["fault_log"][0]
    text = checker.summary(v)
    assert "FAIL" in text and "lost       1" in text and "lost: b" in text
    assert len(text.splitlines()) < 25  # one screen


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        checker.check([], mode="maybe")


def test_the_history_file_round_trips(tmp_path: Path) -> None:
    h = history.History(tmp_path / "h.jsonl")
    h.add("attempt", "s0", ["a"])
    h.add("ok", "s0", ["a"], lat=0.002)
    h.add("fault", "n", kind="kill", target="primary")
    h.close()
    lines = (tmp_path / "h.jsonl").read_text().splitlines()
    assert [json.loads(x)["ev"] for x in lines] == ["attempt", "ok", "fault"]
    events = list(history.read(tmp_path / "h.jsonl"))
    assert events[1]["vs"] == ["a"] and events[1]["lat"] == 0.002 and events[2]["kind"] == "kill"
    assert all(e["t"] >= 0 for e in events)
    assert checker.check(events)["lost"] == 1
