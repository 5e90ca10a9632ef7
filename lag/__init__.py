"""Consumer lag and pipeline health: how far the aggregates pipeline is behind the log.

`lag.model` (dataclasses) and `lag.status` (the Burrow-style evaluator) are pure and import
nothing from the rest of the project; `lag.sources`, `lag.sampler`, `lag.report` and
`lag.feed` connect them to the log, the store and the API.
"""
