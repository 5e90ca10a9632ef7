"""Consumer lag and pipeline health: how far the aggregates pipeline is behind the log.

`lag.model` (verdicts and reports) and `lag.status` (the Burrow-style evaluator) are pure,
over the samples and statuses of `store.lag`; `lag.sources`, `lag.sampler`, `lag.report`
and `lag.feed` connect them to the log, the store and the websocket.
"""
