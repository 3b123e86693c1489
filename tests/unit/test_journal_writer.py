"""The journal's writer thread holds nothing of a batch once it has reported it back."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path

from tandem.journal import files as jf
from tandem.journal.writer import Batch, Writer


def test_an_idle_writer_keeps_no_batch_alive(tmp_path: Path) -> None:
    """An idle journal (a broker after a storm of departures) must not keep its last batch, every
    record of it, alive until the next write comes (docs/decisions/0057)."""
    done = threading.Event()
    writer = Writer(tmp_path, "t", 64 * 1024, 0, False, [], lambda batch, err: done.set())
    writer.start()
    try:
        key = 1 << jf.KEY_SHIFT
        batch = Batch(writes=[(key, jf.FILE_HEADER_SIZE, b"x" * 100)], new_files={key: 64 * 1024})
        ref = weakref.ref(batch)
        writer.submit(batch)
        del batch
        assert done.wait(10)
        deadline = time.monotonic() + 5
        while ref() is not None and time.monotonic() < deadline:
            time.sleep(0.01)  # the thread recycles and flushes after reporting the batch
            gc.collect()
        assert ref() is None, "the writer thread still holds its last batch"
    finally:
        writer.stop()
