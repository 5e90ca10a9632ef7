"""Events in: the event model and validation, the durable partitioned log, producers, the Spark source."""
