"""The `tandem` PySpark data source: exactly-once streaming reads and writes, batch reads and writes.

Reading keeps Spark's checkpoint as the truth. Offsets are per-queue sequence numbers
({queue: seq}, keys sorted); a batch is the messages with start < seq <= end, read without
consuming them, so a restarted query reads the same batch again; `commit(end)` acknowledges
up to end (the broker's retention). Queues read this way belong to the reader.

Writing sends each partition's rows in one broker transaction whose transaction dedup id is
(query id, batch, partition): a retried task or a replayed batch commits nothing twice, and a
commit lost in a failover is resolved by asking the broker whether that id was committed.

Nothing here opens a connection in `__init__`: readers and writers are pickled to executors.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from .options import ReadOptions, WriteOptions, client_options

READ_CHUNK = 20_000  # messages per READ_RANGE call


def schema_ddl(body: str = "BINARY") -> str:
    """The rows a read gives: one per message."""
    return (
        f"queue STRING NOT NULL, sequence BIGINT NOT NULL, message_id BIGINT NOT NULL, body {body}, "
        "properties MAP<STRING, STRING>, priority INT NOT NULL, timestamp TIMESTAMP, delivery_count INT NOT NULL, "
        "dedup_id STRING"
    )


class TandemDataSource(DataSource):
    """`spark.readStream.format("tandem").option("url", ...).option("queue", ...)` and the writers."""

    @classmethod
    def name(cls) -> str:
        return "tandem"

    def schema(self) -> str:
        keys = {k.lower() for k in self.options}
        if "address" in keys and "queue" not in keys:
            return schema_ddl()  # writing: the rows' own schema is used
        opts = ReadOptions.parse(self.options)
        opts.check_reachable()  # at load(), in the caller's thread: not later inside the query
        return schema_ddl(opts.body_ddl())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TandemStreamReader(ReadOptions.parse(self.options), schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return TandemBatchReader(ReadOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return TandemStreamWriter(WriteOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return TandemBatchWriter(WriteOptions.parse(self.options), schema)


# ----------------------------------------------------------------------------- reading
@dataclass
class RangePartition(InputPartition):
    queue: str
    start: int  # exclusive
    end: int  # inclusive


def split(queue: str, start: int, end: int, parts: int) -> list[RangePartition]:
    """(start, end] in `parts` contiguous ranges (fewer if it is short)."""
    span = end - start
    if span <= 0:
        return []
    parts = max(1, min(parts, span))
    step, extra = divmod(span, parts)
    out = []
    lo = start
    for i in range(parts):
        hi = lo + step + (1 if i < extra else 0)
        out.append(RangePartition(queue, lo, hi))
        lo = hi
    return out


class _Driver:
    """A connection kept by the driver-side reader (Spark polls latestOffset many times a second)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.loop = asyncio.new_event_loop()
        self.conn: Any = None
        self.session: Any = None

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _session(self) -> Any:
        if self.conn is None or self.conn.closed:
            from ..client.connection import AsyncConnection

            self.conn = await AsyncConnection.connect(
                self.opts.url, **client_options(self.opts.client, connect_retries=True)
            )
            self.session = await self.conn.create_session()
        return self.session

    def offsets(self) -> dict[str, tuple[int, int]]:
        async def go() -> dict[str, tuple[int, int]]:
            s = await self._session()
            return {q: await s.queue_offsets(q) for q in self.opts.queues}

        return self.run(_retrying(go))  # type: ignore[no-any-return]

    def ack(self, end: dict[str, int]) -> None:
        async def go() -> None:
            s = await self._session()
            for q in sorted(end):
                await s.ack_upto(q, int(end[q]))

        self.run(_retrying(go))


async def _retrying(make: Any, attempts: int = 5) -> Any:
    """Retry an idempotent step across a failover (the client reconnects; reads and acks repeat safely)."""
    from ..errors import CallTimeout, ConnectionLost

    for i in range(attempts):
        try:
            return await make()
        except (ConnectionLost, CallTimeout):
            if i == attempts - 1:
                raise
            await asyncio.sleep(0.2 * (i + 1))
    return None


class TandemStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._driver: _Driver | None = None
        self._until: dict[str, int] | None = None  # Trigger.AvailableNow: what the queues held at start
        opts.check_reachable()

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "schema": self.schema, "_driver": None, "_until": None}

    def prepareForTriggerAvailableNow(self) -> None:
        """Read what is there now and stop: later messages wait for the next run."""
        self._until = {q: last for q, (_, last) in self._d().offsets().items()}

    def _d(self) -> _Driver:
        if self._driver is None:
            self._driver = _Driver(self.opts)
        return self._driver

    def initialOffset(self) -> dict[str, int]:
        """The first unacknowledged message of each queue (deterministic: a restart before batch 0 agrees)."""
        offs = self._d().offsets()
        return {q: offs[q][0] - 1 for q in sorted(offs)}

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        n = self.opts.max_messages_per_trigger
        return ReadMaxRows(n) if n > 0 else ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        offs = self._d().offsets()
        end = {q: max(int(start.get(q, offs[q][0] - 1)), offs[q][1]) for q in sorted(offs)}
        if self._until is not None:
            end = {q: max(int(start.get(q, end[q])), min(end[q], self._until[q])) for q in end}
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
            capped = {}
            for q in sorted(end):
                s = int(start.get(q, end[q]))
                take = max(0, min(end[q] - s, budget))
                capped[q] = s + take
                budget -= take
            end = capped
        return dict(sorted(end.items()))

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[RangePartition]:
        per_queue = max(1, self.opts.min_partitions // max(1, len(end)))
        out: list[RangePartition] = []
        for q in sorted(end):
            out.extend(split(q, int(start.get(q, end[q])), int(end[q]), per_queue))
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition)
        yield from read_partition(self.opts, self.schema, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Everything up to `end` is in Spark's checkpoint: the broker may let it go."""
        self._d().ack(end)

    def stop(self) -> None:
        d, self._driver = self._driver, None
        if d is not None and d.conn is not None:
            d.run(d.conn.close())


def read_partition(opts: ReadOptions, schema: StructType, part: RangePartition) -> Iterator[Any]:
    """Executor side: its own connection; the range read in chunks, each yielded as an Arrow record batch.

    The next chunk is asked for before the current one is handed to Spark, so the broker
    encodes it while Spark works.
    """
    from ..client.connection import AsyncConnection

    loop = asyncio.new_event_loop()
    conn: Any = None
    session: Any = None

    async def fetch(lo: int) -> Any:
        nonlocal conn, session
        if conn is None or conn.closed:
            conn = await AsyncConnection.connect(opts.url, **client_options(opts.client, connect_retries=True))
            session = None
        if session is None:
            session = await conn.create_session()
        try:
            return await session.read_range_records(part.queue, lo, part.end, READ_CHUNK)
        except BaseException:
            session = None  # made again on the retry (after a failover the old one is gone)
            raise

    def ask(lo: int) -> asyncio.Task[Any]:
        task = loop.create_task(_retrying(lambda: fetch(lo)))
        loop.run_until_complete(asyncio.sleep(0))  # the request leaves now
        return task

    arrow = arrow_schema(schema)
    try:
        pending: asyncio.Task[Any] | None = ask(part.start) if part.start < part.end else None
        while pending is not None:
            _first, _last, records = loop.run_until_complete(pending)
            pending = None
            if not records:
                break
            lo = records[-1][0]
            if lo < part.end:  # a chunk short of the end: large bodies made the broker stop early, or gaps
                pending = ask(lo)
            yield record_batch(part.queue, records, opts, arrow)
    finally:
        if conn is not None:
            loop.run_until_complete(conn.close())
        loop.close()


def arrow_schema(schema: StructType) -> Any:
    """The Arrow form of the schema Spark resolved (the body may be a JSON struct)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    return pa.schema([pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC"), f.nullable) for f in schema.fields])


def record_batch(queue: str, records: list[Any], opts: ReadOptions, arrow: Any) -> Any:
    """(seq, id, delivery count, message data, size) records as one Arrow record batch, column by column."""
    import pyarrow as pa

    n = len(records)
    datas = [r[3] for r in records]
    bodies: list[Any] = [d.body for d in datas]
    if opts.body_format == "string":
        bodies = [b.decode("utf-8", "replace") for b in bodies]
    elif opts.body_format == "json":
        bodies = [_json_or_none(b) for b in bodies]
    columns = {
        "queue": pa.array([queue] * n, pa.string()),
        "sequence": pa.array([r[0] for r in records], pa.int64()),
        "message_id": pa.array([r[1] for r in records], pa.int64()),
        "body": bodies,
        "properties": [
            [(k, v.decode("utf-8", "replace") if isinstance(v, bytes) else _text(v)) for k, v in d.properties.items()]
            if d.properties
            else []
            for d in datas
        ],
        "priority": pa.array([d.priority for d in datas], pa.int32()),
        "timestamp": [d.timestamp * 1000 if d.timestamp else None for d in datas],  # microseconds
        "delivery_count": pa.array([r[2] for r in records], pa.int32()),
        "dedup_id": pa.array([d.dedup_id for d in datas], pa.string()),
    }
    arrays = []
    for f in arrow:
        col = columns[f.name]
        if isinstance(col, pa.Array) and col.type == f.type:
            arrays.append(col)
        elif f.name == "body" and opts.body_format == "json":
            arrays.append(_json_column(col, f.type))
        else:
            arrays.append(pa.array(col, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow)


def _json_column(values: list[Any], type_: Any) -> Any:
    """JSON objects as the struct type; a row whose values do not fit the schema becomes null."""
    import pyarrow as pa

    try:
        return pa.array(values, type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        out = []
        for v in values:
            try:
                pa.array([v], type_)
                out.append(v)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                out.append(None)
        return pa.array(out, type_)


def _json_or_none(body: bytes) -> Any:
    """A body that is not a JSON object gives a null struct (as Spark's from_json in permissive mode)."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class TandemBatchReader(DataSourceReader):
    """Browse what the queues hold now into a DataFrame (nothing is consumed)."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        opts.check_reachable()

    def partitions(self) -> list[RangePartition]:
        d = _Driver(self.opts)
        try:
            offs = d.offsets()
        finally:
            if d.conn is not None:
                d.run(d.conn.close())
            d.loop.close()
        per_queue = max(1, self.opts.min_partitions // max(1, len(offs)))
        out: list[RangePartition] = []
        for q in sorted(offs):
            first, last = offs[q]
            out.extend(split(q, first - 1, last, per_queue))
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition)
        yield from read_partition(self.opts, self.schema, partition)


# ----------------------------------------------------------------------------- writing
@dataclass
class Written(WriterCommitMessage):
    partition: int
    rows: int
    transaction: str


def write_partition(opts: WriteOptions, fields: list[str], rows: Iterator[Any], tx_id: str, partition: int) -> Written:
    """One broker transaction for the partition, with `tx_id` as its dedup id: at most once per id.

    Rows whose dedup_id the address has already seen are dropped, as a plain send would drop
    them: the broker refuses the whole transaction naming them, and it is sent again without.
    """
    from ..client.connection import AsyncConnection
    from ..client.message import Message
    from ..errors import DuplicateId, TransactionOutcomeUnknown, TransactionRolledBack

    messages = _first_of_each_dedup_id([to_message(opts, fields, row) for row in rows])
    extra = client_options(opts.client, connect_retries=True)
    extra.setdefault("auto_dedup", False)  # the transaction's dedup id already makes a resend safe

    async def go() -> None:
        nonlocal messages
        conn = await AsyncConnection.connect(opts.url, **extra)
        try:
            session = await conn.create_session(transacted=True)
            producer = session.create_producer(opts.address)
            rolled_back = 0
            while True:
                try:
                    for m in messages:
                        await producer.send_async(Message(**m))
                    await session.commit(dedup_id=tx_id)
                    return
                except DuplicateId as exc:
                    seen = {d for a, d in exc.duplicates if a == opts.address}
                    if not seen:
                        raise
                    messages = [m for m in messages if m.get("dedup_id") not in seen]
                except (TransactionRolledBack, TransactionOutcomeUnknown):
                    rolled_back += 1
                    if rolled_back == 5:
                        raise
                    await asyncio.sleep(0.2)  # failed over mid-transaction: the same id makes a retry safe
        finally:
            await conn.close()

    asyncio.run(go())
    _injected_fault("after-commit", opts.address)
    return Written(partition, len(messages), tx_id)


def _first_of_each_dedup_id(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for m in messages:
        d = m.get("dedup_id")
        if d is not None:
            if d in seen:
                continue
            seen.add(d)
        out.append(m)
    return out


FAULT_DIR_ENV = "TANDEM_SPARK_FAULT_DIR"


def _injected_fault(point: str, address: str) -> None:
    """Fault injection for tests: fail this task once if `<$TANDEM_SPARK_FAULT_DIR>/<point>-<address>` exists.

    The marker is removed by the task that fails (rename is atomic), so exactly one task fails
    and its retry runs normally: this is how the tests show that a task retried after its
    transaction committed writes nothing twice.
    """
    import os

    root = os.environ.get(FAULT_DIR_ENV)
    if not root:
        return
    marker = os.path.join(root, f"{point}-{address}")
    try:
        os.rename(marker, marker + ".fired")
    except OSError:
        return
    raise RuntimeError(f"injected fault {point} for {address}")


def to_message(opts: WriteOptions, fields: list[str], row: Any) -> dict[str, Any]:
    values = row.asDict() if hasattr(row, "asDict") else dict(zip(fields, row, strict=False))
    body = values.get(opts.body_column)
    if body is None and opts.body_column == "body" and "value" in values:
        body = values["value"]
    if isinstance(body, bytearray):
        body = bytes(body)
    elif body is None:
        body = b""
    elif not isinstance(body, (bytes, str)):
        body = json.dumps(body, default=str)
    props = values.get("properties") or {}
    if not isinstance(props, dict):
        props = dict(props)
    msg: dict[str, Any] = {
        "body": body,
        "properties": {str(k): str(v) for k, v in props.items()} or None,
        "durable": opts.durable,
    }
    if values.get("dedup_id") is not None:
        msg["dedup_id"] = str(values["dedup_id"])
    if values.get("priority") is not None:
        msg["priority"] = int(values["priority"])
    return msg


class TandemStreamWriter(DataSourceStreamWriter):
    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.fields = [f.name for f in schema.fields]
        opts.check_reachable()

    def write(self, iterator: Iterator[Any]) -> Written:
        from pyspark import TaskContext

        tc = TaskContext.get()
        assert tc is not None
        batch = tc.getLocalProperty("streaming.sql.batchId")
        # The query id is kept in the checkpoint: the same for a restarted query, new for a new checkpoint.
        query = tc.getLocalProperty("sql.streaming.queryId")
        tx_id = f"spark:{query}:{batch}:{tc.partitionId()}"
        return write_partition(self.opts, self.fields, iterator, tx_id, tc.partitionId())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Each partition committed its own transaction (idempotent by id); nothing is left to publish."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Never undo: a partition whose transaction committed stays committed; a replay is a no-op for it."""


class TandemBatchWriter(DataSourceWriter):
    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.fields = [f.name for f in schema.fields]
        self.job = uuid.uuid4().hex  # made on the driver, shared by the tasks (and their retries) of this job
        opts.check_reachable()

    def write(self, iterator: Iterator[Any]) -> Written:
        from pyspark import TaskContext

        tc = TaskContext.get()
        assert tc is not None
        tx_id = f"spark-batch:{self.job}:{tc.partitionId()}"
        return write_partition(self.opts, self.fields, iterator, tx_id, tc.partitionId())
