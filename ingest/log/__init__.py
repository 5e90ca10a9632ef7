"""The durable partitioned event log: interface and backends."""

from ingest.log.base import AppendResult, EventLog, LogUnavailable, PartitionOffsets, RecordTooLarge, TopicMismatch
from ingest.log.sqlite import SqliteEventLog

__all__ = ["AppendResult", "EventLog", "LogUnavailable", "PartitionOffsets", "RecordTooLarge", "SqliteEventLog",
           "TopicMismatch"]
