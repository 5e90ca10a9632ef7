"""The ingest worker processes on /metrics (api/ingest_workers.py): how many serve, how many
bodies wait for one, what they appended, and how often one had to be replaced; an operator sees
there whether `ingest_processes` is enough (bodies waiting) and whether workers die (replaced)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# (family, name, help, the IngestWorkers attribute it reads)
_FAMILIES = (
    (GaugeMetricFamily, "sketchboard_ingest_workers_configured",
     "Ingest worker processes the API runs (ingest_processes, resolved)", "processes"),
    (GaugeMetricFamily, "sketchboard_ingest_workers_ready",
     "Ingest worker processes started and serving (busy or idle); fewer than configured while they start, and"
     " bodies meanwhile take the API process's threads", "ready"),
    (GaugeMetricFamily, "sketchboard_ingest_worker_groups_in_progress",
     "Groups of request bodies handed to an ingest worker and not yet answered", "busy"),
    (GaugeMetricFamily, "sketchboard_ingest_bodies_waiting", "Request bodies waiting for an idle ingest worker",
     "waiting"),
    (CounterMetricFamily, "sketchboard_ingest_worker_bodies_appended",
     "Request bodies the ingest workers appended to the log", "handled"),
    (CounterMetricFamily, "sketchboard_ingest_worker_groups",
     "Groups of request bodies handed to the ingest workers (bodies waiting together go as one, appended in one"
     " transaction)", "groups"),
    (CounterMetricFamily, "sketchboard_ingest_workers_replaced",
     "Ingest worker processes whose conversation broke off (died, or answered out of turn), each replaced by a"
     " new one", "replaced"),
)


def ingest_worker_metrics(workers) -> list:
    """`workers`: an api.ingest_workers.IngestWorkers (read from the scrape's thread: plain ints
    and lengths, each read once)."""
    families = []
    for family, name, description, attribute in _FAMILIES:
        metric = family(name, description)
        metric.add_metric([], getattr(workers, attribute))
        families.append(metric)
    return families
