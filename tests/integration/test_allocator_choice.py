"""`memory-allocator`: the broker process runs with the allocator its configuration names (real
processes; decision 0083). `tandem run` starts itself again in the environment an allocator
needs: the same process id, the allocator loaded, and it says which in `tandem admin status`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker_process import BrokerProcess
from metrics_workload import parse, value
from mgmt_http import Api
from replicated_pair import admin_status_json

_status = admin_status_json


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("setting", [None, "mimalloc", "malloc", "python"])
def test_the_broker_runs_with_the_allocator_it_is_configured_with(broker_factory: Any, setting: str | None) -> None:
    settings = {} if setting is None else {"memory_allocator": setting}
    b: BrokerProcess = broker_factory(extra_toml='management = { bind = "127.0.0.1:0" }\n', **settings).start()
    assert b.proc is not None
    expected = setting or "python"  # the default: Python's own
    status = _status(b.url)
    assert status["memory_allocator"] == expected, status
    assert ("libmimalloc" in _maps(b.proc.pid)) is (expected == "mimalloc")  # the process started, not a child
    assert f"memory allocator: {expected}" in b.log_text()
    metrics = Api.of(b).get("/metrics")
    assert metrics.status == 200, metrics.body
    assert value(parse(metrics.body.decode()), "tandem_info", memory_allocator=expected) == 1


def test_a_pythonmalloc_set_by_whoever_starts_the_broker_wins(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(env={"PYTHONMALLOC": "malloc"}).start()
    assert b.proc is not None
    assert _status(b.url)["memory_allocator"] == "malloc"
    assert "libmimalloc" not in _maps(b.proc.pid)


def test_an_unknown_allocator_is_a_configuration_error_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(f'data-directory = "{tmp_path / "data"}"\nmemory-allocator = "tcmalloc"\n')
    r = subprocess.run(
        [sys.executable, "-m", "tandem", "run", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r
    assert "memory-allocator" in r.stderr and "tcmalloc" in r.stderr, r.stderr
