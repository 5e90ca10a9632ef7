"""The Spark jobs: per-batch partial aggregation of panes and the exactly-once commit into the store."""
