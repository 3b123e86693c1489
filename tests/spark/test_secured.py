"""The tandem data source against a secured broker: credentials as options or in the URL, the
permissions its readers and writers need, and failures that name the problem without the password."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from brokerio import batches, drain, fill, stat

from broker_process import BrokerProcess
from secured import password_of, secured, url_for

pytestmark = pytest.mark.timeout(300)

USERS = {"etl": ["etl"], "outsider": ["outsider"], "admin": ["admin"]}
SETTINGS = (
    '[security-settings."#"]\n'
    'send = ["admin"]\nconsume = ["admin"]\nbrowse = ["admin"]\ncreate-address = ["admin"]\n'
    'create-durable-queue = ["admin"]\nmanage = ["admin"]\n'
    '[security-settings."etl.#"]\n'
    'send = ["etl", "admin"]\nconsume = ["etl", "admin"]\nbrowse = ["etl", "admin"]\n'
    'create-address = ["etl", "admin"]\ncreate-durable-queue = ["etl", "admin"]\nmanage = ["admin"]\n'
)


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("spark-secured")
    broker = BrokerProcess(tmp / "data", name="spark-secured", **secured(tmp, USERS, SETTINGS)).start()
    yield broker
    broker.kill()


def test_a_stream_and_a_batch_write_log_in_with_their_options(spark: Any, sb: BrokerProcess, tmp_path: Path) -> None:
    admin = url_for(sb.url, "admin")
    fill(admin, "etl.in", [f"m{i}" for i in range(120)])
    out, chk = tmp_path / "out", tmp_path / "chk"
    q = (
        spark.readStream.format("tandem")
        .option("url", url_for(sb.url, "etl"))  # credentials in the URL
        .option("queue", "etl.in")
        .option("maxMessagesPerTrigger", "50")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(chk))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(240)
    assert not q.isActive and q.exception() is None
    rows = spark.read.parquet(str(out)).select("sequence").collect()
    assert sorted(r.sequence for r in rows) == list(range(1, 121))
    assert len(batches(chk, "commits")) == 3
    assert json.loads((chk / "offsets" / "2").read_text().splitlines()[-1]) == {"etl.in": 120}
    # the acknowledgements of the committed batches went through with the etl user's `consume`
    assert stat(admin, "etl.in")["message_count"] <= 50

    df = spark.createDataFrame([(f"w{i}",) for i in range(30)], "body STRING").repartition(2)
    # credentials as options: Spark redacts option keys named like `password` in plans and the UI
    df.write.format("tandem").option("url", sb.url).option("username", "etl").option(
        "password", password_of("etl")
    ).option("address", "etl.out").mode("append").save()
    assert sorted(m.text for m in drain(admin, "etl.out")) == sorted(f"w{i}" for i in range(30))


def test_a_wrong_password_or_a_missing_permission_fails_at_load_without_showing_the_password(
    spark: Any, sb: BrokerProcess
) -> None:
    fill(url_for(sb.url, "admin"), "etl.guarded", ["x"])
    wrong = f"{sb.url}?username=etl&password=not-the-Secret-42"
    for streaming in (True, False):
        reader = spark.readStream.format("tandem") if streaming else spark.read.format("tandem")
        with pytest.raises(Exception, match=r"(?i)login|authenticat") as info:
            reader.option("url", wrong).option("queue", "etl.guarded").load()
        assert "not-the-Secret-42" not in str(info.value), str(info.value)
    # a user who may not consume from the queue is refused naming the permission
    reader = spark.read.format("tandem").option("url", url_for(sb.url, "outsider")).option("queue", "etl.guarded")
    with pytest.raises(Exception, match="'consume'") as denied:
        reader.load().collect()
    assert password_of("outsider") not in str(denied.value)
    df = spark.createDataFrame([("a",)], "body STRING")
    with pytest.raises(Exception, match="'send'"):
        df.write.format("tandem").option("url", url_for(sb.url, "outsider")).option("address", "etl.out").mode(
            "append"
        ).save()
    assert stat(url_for(sb.url, "admin"), "etl.guarded")["message_count"] == 1
