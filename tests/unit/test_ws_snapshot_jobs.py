"""A connection's snapshot jobs (api/ws_routes.py SnapshotJobs): oldest first, a newer subscribe
of an id replaces its waiting job, a dropped one never runs, and what waits stays bounded."""

from __future__ import annotations

import asyncio

from api.ws_hub import Client
from api.ws_routes import SnapshotJobs
from tests.support.loops import run_on_own_loop


def test_jobs_run_oldest_first_a_replaced_id_once_at_its_new_place_and_a_dropped_one_never():
    async def scenario():
        jobs, ran = SnapshotJobs(), []

        def job(name):
            async def run():
                ran.append(name)
            return run

        jobs.add("a", job("a1"))
        jobs.add("b", job("b"), version=True)
        jobs.add("a", job("a2"))  # replaces a1, and now comes after b
        jobs.add("c", job("c"), version=True)
        assert jobs.versions_waiting() == 2
        jobs.drop("c")
        assert jobs.versions_waiting() == 1
        runner = asyncio.create_task(jobs.run(Client(16, 4)))
        await asyncio.sleep(0.05)
        assert ran == ["b", "a2"] and jobs.versions_waiting() == 0
        jobs.add("d", job("d"))  # the runner waits for more, then runs it
        await asyncio.sleep(0.05)
        runner.cancel()
        return ran

    assert run_on_own_loop(scenario()) == ["b", "a2", "d"]


def test_a_job_that_raises_is_answered_with_an_error_and_the_next_runs():
    async def scenario():
        jobs, client, ran = SnapshotJobs(), Client(16, 4), []

        async def broken():
            raise RuntimeError("a bug")

        async def fine():
            ran.append("fine")

        jobs.add("x", broken)
        jobs.add("y", fine)
        runner = asyncio.create_task(jobs.run(client))
        await asyncio.sleep(0.05)
        runner.cancel()
        return [item.msg for item in client.queue.items], ran

    replies, ran = run_on_own_loop(scenario())
    assert ran == ["fine"]
    assert [(r["type"], r["id"]) for r in replies] == [("error", "x")]
    assert "could not be computed" in replies[0]["reason"]
