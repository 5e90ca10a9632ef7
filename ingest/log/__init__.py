"""The durable partitioned event log: interface and backends."""

from ingest.log.base import AppendResult, EventLog, PartitionOffsets
from ingest.log.sqlite import SqliteEventLog

__all__ = ["AppendResult", "EventLog", "PartitionOffsets", "SqliteEventLog"]
