"""The activation sequence: which (local, coordinated) pairs may activate, and the local copy on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tandem.errors import IllegalState, InvalidArgument
from tandem.ha.activation_sequence import (
    SEQUENCE_FILE,
    Verdict,
    judge,
    read_local_sequence,
    write_local_sequence,
)


@pytest.mark.parametrize(
    ("local", "coordinated", "verdict"),
    [
        (0, 0, Verdict.IN_SYNC),  # a new pair
        (3, 3, Verdict.IN_SYNC),
        (3, -3, Verdict.INTERRUPTED),  # our own claim of 3: local copy written, commit lost
        (3, -4, Verdict.INTERRUPTED),  # a claim of 4 from where we are: its claimant never served at 4
        (0, -1, Verdict.INTERRUPTED),
        (3, 4, Verdict.STALE),  # someone activated after our data was last in sync
        (3, -5, Verdict.STALE),  # a claim from a value we never had
        (3, -2, Verdict.STALE),
        (4, 3, Verdict.STALE),  # local ahead of ZooKeeper: only by hand or a lost ZooKeeper
        (2, 0, Verdict.STALE),
    ],
)
def test_judge(local: int, coordinated: int, verdict: Verdict) -> None:
    assert judge(local, coordinated) is verdict
    assert verdict.may_activate == (verdict is not Verdict.STALE)


def test_judge_refuses_a_negative_local_value() -> None:
    with pytest.raises(InvalidArgument):
        judge(-1, 0)


def test_the_local_copy_starts_at_zero_and_is_written_whole(tmp_path: Path) -> None:
    assert read_local_sequence(tmp_path) == 0
    assert not (tmp_path / SEQUENCE_FILE).exists(), "reading creates nothing"
    write_local_sequence(tmp_path, 7)
    assert read_local_sequence(tmp_path) == 7
    assert (tmp_path / SEQUENCE_FILE).read_text() == "7\n"
    write_local_sequence(tmp_path, 8)
    assert read_local_sequence(tmp_path) == 8
    assert sorted(os.listdir(tmp_path)) == [SEQUENCE_FILE], "no temporary file left behind"


def test_a_missing_data_directory_is_created(tmp_path: Path) -> None:
    write_local_sequence(tmp_path / "new", 1)
    assert read_local_sequence(tmp_path / "new") == 1


@pytest.mark.parametrize("text", ["", "x\n", "-1\n", "1.5\n", "12 13\n"])
def test_a_damaged_local_copy_is_refused_naming_the_file(tmp_path: Path, text: str) -> None:
    (tmp_path / SEQUENCE_FILE).write_text(text)
    with pytest.raises(IllegalState) as info:
        read_local_sequence(tmp_path)
    assert str(tmp_path / SEQUENCE_FILE) in str(info.value)


def test_a_negative_value_is_never_written(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        write_local_sequence(tmp_path, -1)
    assert not (tmp_path / SEQUENCE_FILE).exists()
