"""The tandem data source under a real local[2,3] Spark against a real broker process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from brokerio import batches, drain, fill, make_queue, stat

from broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def b(tmp_path_factory: pytest.TempPathFactory) -> Any:
    broker = BrokerProcess(tmp_path_factory.mktemp("spark-broker") / "data", name="spark").start()
    yield broker
    broker.kill()


def test_batch_read_browses_every_column_without_consuming(spark: Any, b: BrokerProcess) -> None:
    fill(b.url, "br.in", [f"m{i}" for i in range(50)], properties={"kind": "order"})
    df = spark.read.format("tandem").option("url", b.url).option("queue", "br.in").load()
    assert [f.name for f in df.schema.fields] == [
        "queue", "sequence", "message_id", "body", "properties", "priority", "timestamp", "delivery_count", "dedup_id",
    ]  # fmt: skip
    rows = sorted(df.collect(), key=lambda r: r.sequence)
    assert [r.sequence for r in rows] == list(range(1, 51))
    assert [bytes(r.body) for r in rows] == [f"m{i}".encode() for i in range(50)]
    assert all(r.queue == "br.in" and r.properties == {"kind": "order"} for r in rows)
    assert all(r.priority == 4 and r.delivery_count == 1 and r.timestamp is not None for r in rows)
    assert len({r.message_id for r in rows}) == 50
    assert stat(b.url, "br.in")["message_count"] == 50  # browsing consumed nothing


def test_bodies_as_text_and_as_json_with_a_schema(spark: Any, b: BrokerProcess) -> None:
    fill(b.url, "js.in", [json.dumps({"i": i, "name": f"n{i}"}) for i in range(20)] + ["not json", '{"i": "x"}'])
    reader = spark.read.format("tandem").option("url", b.url).option("queue", "js.in")
    text = reader.option("bodyFormat", "string").load()
    assert {"not json", '{"i": "x"}', '{"i": 0, "name": "n0"}'} <= {r.body for r in text.collect()}
    js = reader.option("bodyFormat", "json").option("jsonSchema", "i INT, name STRING").load()
    rows = sorted(js.collect(), key=lambda r: r.sequence)
    assert [r.body.i for r in rows[:20]] == list(range(20))
    assert rows[3].body.name == "n3"
    assert rows[20].body is None and rows[21].body is None  # not an object / does not fit the schema


def test_batch_write_sends_bodies_properties_and_dedup_ids(spark: Any, b: BrokerProcess) -> None:
    make_queue(b.url, "bw.out")
    data = [(f"body{i}", {"n": str(i)}, f"d{i % 30}") for i in range(40)]  # 10 repeated dedup ids
    df = spark.createDataFrame(data, "body STRING, properties MAP<STRING, STRING>, dedup_id STRING").repartition(1)
    df.write.format("tandem").option("url", b.url).option("address", "bw.out").mode("append").save()
    got = drain(b.url, "bw.out")
    assert sorted(m.text for m in got) == sorted(f"body{i}" for i in range(30))
    assert {m.properties["n"] for m in got} == {str(i) for i in range(30)}
    assert {m.dedup_id for m in got} == {f"d{i}" for i in range(30)}


def test_batch_write_drops_rows_whose_dedup_id_an_earlier_write_used(spark: Any, b: BrokerProcess) -> None:
    """The broker refuses the second transaction naming d5..d9; the sink sends it again without them."""
    make_queue(b.url, "bw.again")
    schema = "body STRING, dedup_id STRING"
    for rows in ([(f"one{i}", f"d{i}") for i in range(10)], [(f"two{i}", f"d{i}") for i in range(5, 15)]):
        df = spark.createDataFrame(rows, schema).repartition(1)
        df.write.format("tandem").option("url", b.url).option("address", "bw.again").mode("append").save()
    got = drain(b.url, "bw.again")
    assert sorted(m.text for m in got) == sorted([f"one{i}" for i in range(10)] + [f"two{i}" for i in range(10, 15)])


def test_batch_write_body_column_priority_and_non_durable(spark: Any, b: BrokerProcess) -> None:
    make_queue(b.url, "bw.opts")
    df = spark.createDataFrame([("low", 0), ("high", 9), ("default", None)], "payload STRING, priority INT")
    (
        df.repartition(1)
        .write.format("tandem")
        .option("url", b.url)
        .option("address", "bw.opts")
        .option("bodyColumn", "payload")
        .option("durable", "false")
        .mode("append")
        .save()
    )
    got = drain(b.url, "bw.opts")
    assert [(m.text, m.priority) for m in got] == [("high", 9), ("default", 4), ("low", 0)]  # higher first
    assert not any(m.durable for m in got)


def test_found_by_name_without_register(b: BrokerProcess) -> None:
    """A fresh Spark finds the source through the pyspark_tandem module (static registration)."""
    import subprocess
    import sys

    fill(b.url, "auto.in", ["found"])
    code = (
        "from pyspark.sql import SparkSession\n"
        "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')"
        ".config('spark.driver.bindAddress', '127.0.0.1').config('spark.driver.host', '127.0.0.1').getOrCreate()\n"
        f"rows = s.read.format('tandem').option('url', '{b.url}').option('queue', 'auto.in').load().collect()\n"
        "print('BODIES', [bytes(r.body) for r in rows])\n"
        "s.stop()\n"
    )
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "BODIES [b'found']" in r.stdout, r.stdout + r.stderr[-3000:]


def test_stream_to_parquet_in_limited_batches_then_acks_what_spark_committed(
    spark: Any, b: BrokerProcess, tmp_path: Path
) -> None:
    fill(b.url, "st.a", [f"a{i}" for i in range(700)])
    fill(b.url, "st.b", [f"b{i}" for i in range(300)])
    out, chk = tmp_path / "out", tmp_path / "chk"
    q = (
        spark.readStream.format("tandem")
        .option("url", b.url)
        .option("queue", "st.b,st.a")
        .option("maxMessagesPerTrigger", "250")
        .option("minPartitions", "4")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(chk))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(240)
    assert not q.isActive and q.exception() is None
    rows = spark.read.parquet(str(out)).select("queue", "sequence").collect()
    assert sorted((r.queue, r.sequence) for r in rows) == sorted(
        [("st.a", i) for i in range(1, 701)] + [("st.b", i) for i in range(1, 301)]
    )
    assert len(batches(chk, "commits")) == 4  # 1000 messages, at most 250 a batch
    last = json.loads((chk / "offsets" / "3").read_text().splitlines()[-1])
    assert list(last) == ["st.a", "st.b"] and last == {"st.a": 700, "st.b": 300}  # sorted keys
    # Spark commits a batch to the source when it plans the next: all but the last are acknowledged.
    assert stat(b.url, "st.a")["message_count"] + stat(b.url, "st.b")["message_count"] <= 250


def test_stream_write_with_a_retried_task_after_its_commit_writes_once(
    spark: Any, b: BrokerProcess, tmp_path: Path, arm_fault: Any
) -> None:
    fill(b.url, "rt.in", [f"r{i}" for i in range(400)])
    make_queue(b.url, "rt.out")
    marker = arm_fault("after-commit", "rt.out")
    q = (
        spark.readStream.format("tandem")
        .option("url", b.url)
        .option("queue", "rt.in")
        .option("minPartitions", "2")
        .load()
        .select("body", "properties")
        .writeStream.format("tandem")
        .option("url", b.url)
        .option("address", "rt.out")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(240)
    assert q.exception() is None
    assert not marker.exists() and Path(str(marker) + ".fired").exists()  # one task did fail after committing
    assert sorted(m.text for m in drain(b.url, "rt.out")) == sorted(f"r{i}" for i in range(400))


def test_batch_write_with_a_retried_task_after_its_commit_writes_once(
    spark: Any, b: BrokerProcess, arm_fault: Any
) -> None:
    make_queue(b.url, "rtb.out")
    marker = arm_fault("after-commit", "rtb.out")
    df = spark.createDataFrame([(f"x{i}",) for i in range(300)], "body STRING").repartition(3)
    df.write.format("tandem").option("url", b.url).option("address", "rtb.out").mode("append").save()
    assert Path(str(marker) + ".fired").exists()
    assert sorted(m.text for m in drain(b.url, "rtb.out")) == sorted(f"x{i}" for i in range(300))


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"queue": "q"}, "option 'url' is required"),
        ({"url": "{url}"}, "option 'queue' is required"),
        ({"url": "{url}", "queue": "q", "colour": "red"}, "unknown option 'colour'"),
        ({"url": "{url}", "queue": "q", "maxMessagesPerTrigger": "lots"}, "'maxMessagesPerTrigger' must be an integer"),
        ({"url": "{url}", "queue": "q", "bodyFormat": "xml"}, "option 'bodyFormat' must be binary, string or json"),
        ({"url": "{url}", "queue": "q", "bodyFormat": "json"}, "option 'jsonSchema' is required"),
        ({"url": "{url}", "queue": "q", "bodyFormat": "json", "jsonSchema": "a"}, "option 'jsonSchema' must look like"),
        ({"url": "tcp://127.0.0.1:1", "queue": "q"}, "option 'url': cannot reach the broker"),
        ({"url": "http://x", "queue": "q"}, "option 'url'"),
    ],
)
def test_bad_options_fail_at_load_naming_the_option(
    spark: Any, b: BrokerProcess, options: dict[str, str], expected: str
) -> None:
    for streaming in (True, False):
        reader = spark.readStream.format("tandem") if streaming else spark.read.format("tandem")
        for k, v in options.items():
            reader = reader.option(k, v.replace("{url}", b.url))
        with pytest.raises(Exception, match=expected):
            reader.load()


def test_bad_sink_options_fail_naming_the_option(spark: Any, b: BrokerProcess) -> None:
    df = spark.createDataFrame([("a",)], "body STRING")
    with pytest.raises(Exception, match="option 'address' is required"):
        df.write.format("tandem").option("url", b.url).mode("append").save()
    with pytest.raises(Exception, match="option 'durable' must be true or false"):
        df.write.format("tandem").option("url", b.url).option("address", "x").option("durable", "yes").mode(
            "append"
        ).save()


def test_large_bodies_written_by_the_sink_come_back_whole_through_the_source(spark: Any, b: BrokerProcess) -> None:
    """Bodies over min-large-message-size: the sink's transaction sends them as large messages
    (files on the broker), the source's range reads bring them back byte for byte, in order."""
    import hashlib

    fill(b.url, "lg.rows", [])  # a reader-only queue
    big = [hashlib.sha256(str(i).encode()).digest() * (12_000 + 1000 * i) for i in range(2)]  # 384 KiB, 416 KiB
    data = [(big[0],), (b"small",), (big[1],)]
    df = spark.createDataFrame(data, "body BINARY").repartition(1)
    df.write.format("tandem").option("url", b.url).option("address", "lg.rows").mode("append").save()
    assert len(list((b.data_dir / "large-messages").glob("*.msg"))) == 2
    got = spark.read.format("tandem").option("url", b.url).option("queue", "lg.rows").load().collect()
    rows = sorted(got, key=lambda r: r.sequence)
    assert [hashlib.sha256(bytes(r.body)).hexdigest() for r in rows] == [hashlib.sha256(d[0]).hexdigest() for d in data]
    assert stat(b.url, "lg.rows")["message_count"] == 3


def test_stream_from_a_paged_queue_reads_every_message_once_and_its_acks_free_the_pages(
    spark: Any, tmp_path: Path
) -> None:
    paged = {"pg.#": {"max-size-bytes": 256 * 1024, "address-full-policy": "PAGE", "page-size-bytes": 128 * 1024}}
    pb = BrokerProcess(tmp_path / "paged-broker", name="paged", address_settings=paged).start()
    try:
        n = 3000
        fill(pb.url, "pg.in", [f"p{i:05d}" + "x" * 400 for i in range(n)])
        assert stat(pb.url, "pg.in")["paged_count"] > n // 2
        out, chk = tmp_path / "out", tmp_path / "chk"
        q = (
            spark.readStream.format("tandem")
            .option("url", pb.url)
            .option("queue", "pg.in")
            .option("maxMessagesPerTrigger", "1000")
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(chk))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(240)
        assert not q.isActive and q.exception() is None
        rows = spark.read.parquet(str(out)).select("sequence", "body").collect()
        assert sorted((r.sequence, bytes(r.body)[:6]) for r in rows) == [
            (i + 1, f"p{i:05d}".encode()) for i in range(n)
        ]
        # All batches but the last are acknowledged: their pages go (the cursor moved past them).
        after = stat(pb.url, "pg.in")
        assert after["message_count"] <= 1000 and after["paged_count"] <= 1000
    finally:
        pb.kill()
