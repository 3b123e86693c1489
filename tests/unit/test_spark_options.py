"""Options of the Spark data source: what Spark itself adds passes, anything else is named."""

from __future__ import annotations

import pytest

from tandem.spark.options import OptionError, ReadOptions, WriteOptions

URL = "tcp://127.0.0.1:61616"


def test_sink_accepts_the_options_spark_adds_itself() -> None:
    opts = WriteOptions.parse(
        {"url": URL, "address": "a", "queryName": "alerts", "checkpointLocation": "/tmp/c", "path": "x"}
    )
    assert opts.address == "a"
    assert opts.client == {}


def test_client_options_pass_through_case_insensitively() -> None:
    opts = ReadOptions.parse({"URL": URL, "queue": "b,a", "Retry_Interval": "100"})
    assert opts.queues == ["a", "b"]
    assert opts.client == {"retry_interval": "100"}
    assert opts.min_partitions == 2


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"queue": "q"}, "'url'"),
        ({"url": URL}, "'queue'"),
        ({"url": URL, "queue": "q", "maxMessagesPerTriger": "5"}, "'maxmessagespertriger'"),
        ({"url": URL, "queue": "q", "minPartitions": "0"}, "'minPartitions'"),
        ({"url": URL, "queue": "q", "maxMessagesPerTrigger": "ten"}, "'maxMessagesPerTrigger'"),
        ({"url": URL, "queue": "q", "bodyFormat": "xml"}, "'bodyFormat'"),
        ({"url": URL, "queue": "q", "bodyFormat": "json"}, "'jsonSchema'"),
        ({"url": URL, "queue": "q", "bodyFormat": "json", "jsonSchema": "a INT, b"}, "'jsonSchema'"),
    ],
)
def test_bad_read_options_name_the_option(options: dict[str, str], named: str) -> None:
    with pytest.raises(OptionError, match=named):
        ReadOptions.parse(options)


def test_bad_write_options_name_the_option() -> None:
    with pytest.raises(OptionError, match="'address'"):
        WriteOptions.parse({"url": URL})
    with pytest.raises(OptionError, match="'durable'"):
        WriteOptions.parse({"url": URL, "address": "a", "durable": "maybe"})
