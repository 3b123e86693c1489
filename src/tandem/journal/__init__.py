"""Append-only journal: record codec, segment files, group commit, reload, compaction."""

from .journal import Journal, JournalSettings, JournalStats, LiveRecord
from .records import ADD, BATCH, DELETE, UPDATE, Op

__all__ = ["ADD", "BATCH", "DELETE", "UPDATE", "Journal", "JournalSettings", "JournalStats", "LiveRecord", "Op"]
