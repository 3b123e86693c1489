"""Choosing the broker's memory allocator (server/allocator.py), and mimalloc giving a storm's
pages back when asked (server/memory.py; decision 0083)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from tandem.server import allocator


class Replaced(Exception):
    """os.execve was called (the test stops there)."""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in ("PYTHONMALLOC", "LD_PRELOAD", allocator.MARKER, allocator._ADDED):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(allocator, "_chosen", None)
    return monkeypatch


def _exec_recorder(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str], dict[str, str]]]:
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append((path, argv, env))
        raise Replaced

    monkeypatch.setattr(os, "execve", execve)
    return calls


def test_mimalloc_asked_for_and_not_installed_names_the_setting(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(allocator, "find_mimalloc", lambda: None)
    with pytest.raises(ValueError, match="memory-allocator: mimalloc is not installed"):
        allocator.check("mimalloc")
    assert allocator.check("malloc") == "malloc"
    calls = _exec_recorder(clean_env)
    with pytest.raises(ValueError):
        allocator.start_with("mimalloc")
    assert calls == []


def test_the_environment_each_allocator_needs(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(allocator, "find_mimalloc", lambda: "libmimalloc.so.2")
    assert allocator.environment("python") == {}
    assert allocator.environment("malloc") == {"PYTHONMALLOC": "malloc"}
    assert allocator.environment("mimalloc") == {"PYTHONMALLOC": "malloc", "LD_PRELOAD": "libmimalloc.so.2"}
    clean_env.setenv("LD_PRELOAD", "libother.so")  # the starter's preload is kept, after ours
    assert allocator.environment("mimalloc")["LD_PRELOAD"] == "libmimalloc.so.2 libother.so"


def test_a_command_is_started_again_with_the_allocator_and_marked(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(allocator, "find_mimalloc", lambda: "libmimalloc.so.2")
    calls = _exec_recorder(clean_env)
    with pytest.raises(Replaced):
        allocator.start_with("mimalloc")
    [(path, argv, env)] = calls
    assert path == sys.executable and argv == list(sys.orig_argv)
    assert env["PYTHONMALLOC"] == "malloc" and env["LD_PRELOAD"] == "libmimalloc.so.2"
    assert env[allocator.MARKER] == "mimalloc"
    assert set(env[allocator._ADDED].split(",")) == {"PYTHONMALLOC", "LD_PRELOAD"}


def test_the_started_command_runs_on_and_tidies_its_environment(clean_env: pytest.MonkeyPatch) -> None:
    """The replacement does not start itself again, and takes out what was added for it only."""
    calls = _exec_recorder(clean_env)
    clean_env.setenv(allocator.MARKER, "mimalloc")
    clean_env.setenv(allocator._ADDED, "PYTHONMALLOC")
    clean_env.setenv("PYTHONMALLOC", "malloc")
    clean_env.setenv("LD_PRELOAD", "libmimalloc.so.2 libother.so")  # the starter's, extended: kept
    assert allocator.start_with("mimalloc") == "mimalloc"
    assert calls == []
    assert "PYTHONMALLOC" not in os.environ and allocator.MARKER not in os.environ
    assert os.environ["LD_PRELOAD"] == "libmimalloc.so.2 libother.so"
    assert allocator.running() == "mimalloc"


def test_a_pythonmalloc_set_by_the_starter_wins(clean_env: pytest.MonkeyPatch) -> None:
    calls = _exec_recorder(clean_env)
    clean_env.setenv("PYTHONMALLOC", "pymalloc_debug")
    assert allocator.start_with("mimalloc") == "python (pymalloc_debug)"
    assert calls == []
    assert os.environ["PYTHONMALLOC"] == "pymalloc_debug"


def test_pythons_own_allocator_needs_no_new_start(clean_env: pytest.MonkeyPatch) -> None:
    calls = _exec_recorder(clean_env)
    assert allocator.start_with("python") == "python"
    assert allocator.running() == "python"
    assert calls == []


def test_glibcs_malloc_is_started_again_with_pythonmalloc_only(clean_env: pytest.MonkeyPatch) -> None:
    calls = _exec_recorder(clean_env)
    with pytest.raises(Replaced):
        allocator.start_with("malloc")
    [(_path, _argv, env)] = calls
    assert env["PYTHONMALLOC"] == "malloc" and "LD_PRELOAD" not in env and env[allocator.MARKER] == "malloc"


# A storm's worth of small objects, a few of them kept (as a broker keeps a counter or a
# timestamp set during a storm), then the rest freed: resident MiB before the release and after.
_STORM = textwrap.dedent(
    """
    import gc, json, sys
    from tandem.server import memory

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    start = rss()
    storm = [{"n": i, "name": f"connection-{i}", "buf": bytearray(200)} for i in range(150_000)]
    kept = storm[::5000]
    del storm
    gc.collect()
    freed = rss()
    released = memory.release_free_memory()
    print(json.dumps({"start": start, "freed": freed, "after": rss(), "released": released,
                      "mimalloc": memory._mimalloc is not None, "kept": len(kept)}))
    """
)


def _storm(env: dict[str, str]) -> dict[str, Any]:
    import json

    out = subprocess.run(
        [sys.executable, "-c", _STORM],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_mimalloc_gives_a_storms_pages_back_when_asked() -> None:
    """Without the purge's churn mimalloc keeps the emptied pages (its purge waits for a later
    allocation in the same segment), so `freed` stays high; after it, most of them are back."""
    lib = allocator.find_mimalloc()
    assert lib is not None, "mimalloc is not installed: scripts/ensure-mimalloc.sh installs it"
    r = _storm({"PYTHONMALLOC": "malloc", "LD_PRELOAD": lib})
    assert r["mimalloc"] and r["released"] and r["kept"] == 30
    storm = r["freed"] - r["start"]
    assert storm > 20, r  # the storm's pages stayed resident once its objects were freed
    assert r["after"] - r["start"] < storm / 4, r  # and most are back after the release
