"""The journal fault seam's rules file (TANDEM_JOURNAL_FAULTS_FILE): armed and disarmed while running."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest

from tandem.journal import faults
from tandem.journal.faults import ENV_FILE, Faults


def _arm(path: Path, text: str) -> None:
    path.write_text(text)
    time.sleep(faults.FILE_CHECK * 2)  # past the seam's look-again interval


def test_rules_written_to_the_file_apply_from_then_on_and_go_when_it_is_emptied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rules"
    path.write_text("")
    monkeypatch.setenv(ENV_FILE, str(path))
    monkeypatch.delenv(faults.ENV, raising=False)
    seam = Faults.from_env("tandem-data")
    assert seam is not None
    for _ in range(5):
        seam.hit("sync")  # nothing armed
    _arm(path, "tandem-data:sync=ENOSPC@1\ntandem-bindings:write=EIO\n")
    seam.hit("sync")  # the file's count starts when it appears: the first call goes through
    with pytest.raises(OSError) as info:
        seam.hit("sync")
    assert info.value.errno == errno.ENOSPC
    seam.hit("write")  # the other journal's rule does not apply here
    _arm(path, "")
    seam.hit("sync")


def test_no_variable_no_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_FILE, raising=False)
    monkeypatch.delenv(faults.ENV, raising=False)
    assert Faults.from_env("tandem-data") is None
