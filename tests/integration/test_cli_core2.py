"""CLI flags of broker core II: transacted and deduplicated producers, queue options."""

from __future__ import annotations

import json
import subprocess
import sys

from broker_process import BrokerProcess


def tandem(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tandem", *args], capture_output=True, text=True, timeout=60)


def count(url: str, queue: str) -> int:
    out = tandem("queue", "stat", queue, "--url", url, "--json")
    assert out.returncode == 0, out.stderr
    return int(json.loads(out.stdout)[0]["message_count"])


def test_producer_tx_batch_and_dedup(broker: BrokerProcess) -> None:
    first = tandem("producer", "--url", broker.url, "--destination", "q", "--count", "250", "--tx-batch", "100",
                   "--dedup", "run1")  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "confirmed 250" in first.stdout
    assert count(broker.url, "q") == 250
    # the same ids outside a transaction: confirmed, not routed
    again = tandem("producer", "--url", broker.url, "--destination", "q", "--count", "250", "--dedup", "run1")
    assert again.returncode == 0, again.stderr
    assert count(broker.url, "q") == 250
    # the same ids inside a transaction: the commit fails with DUPLICATE_ID
    in_tx = tandem("producer", "--url", broker.url, "--destination", "q", "--count", "10", "--tx-batch", "5",
                   "--dedup", "run1")  # fmt: skip
    assert in_tx.returncode == 1
    assert "DUPLICATE_ID" in in_tx.stderr
    assert count(broker.url, "q") == 250


def test_queue_create_options(broker: BrokerProcess) -> None:
    out = tandem("queue", "create", "lv", "--url", broker.url, "--last-value-key", "sym", "--exclusive",
                 "--filter", "x > 1")  # fmt: skip
    assert out.returncode == 0, out.stderr
    stat = json.loads(tandem("queue", "stat", "lv", "--url", broker.url, "--json").stdout)[0]
    assert (stat["last_value_key"], stat["exclusive"], stat["filter"]) == ("sym", True, "x > 1")
    bad = tandem("queue", "create", "bad", "--url", broker.url, "--filter", "x >")
    assert bad.returncode == 1 and "INVALID_SELECTOR" in bad.stderr and "position" in bad.stderr
