"""Where the progress endpoint learns of a job: the watch's body for free, else a GET kept a few seconds."""

import asyncio
from collections.abc import Mapping
from typing import Any

from finetune_operator.progress.directory import LOOKUP_SECONDS, JobDirectory, JobFacts


class Cluster:
    def __init__(self) -> None:
        self.watched: dict[tuple[str, str], dict[str, Any]] = {}
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets = 0
        self.now = 0.0

    def known(self, key: tuple[str, str]) -> Mapping[str, Any] | None:
        return self.watched.get(key)

    async def fetch(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.gets += 1
        return self.stored.get((namespace, name))


def body(uid: str, attempt: int) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "status": {"attempt": attempt}}


def test_a_watched_job_costs_no_get() -> None:
    cluster = Cluster()
    cluster.watched[("ml", "demo")] = body("u1", 2)
    directory = JobDirectory(cluster.known, cluster.fetch, clock=lambda: cluster.now)
    assert asyncio.run(directory.lookup("ml", "demo")) == JobFacts("u1", 2)
    assert cluster.gets == 0


def test_without_the_watch_a_get_answers_for_a_few_seconds_found_or_not() -> None:
    cluster = Cluster()
    cluster.stored[("ml", "demo")] = body("u1", 1)
    directory = JobDirectory(cluster.known, cluster.fetch, clock=lambda: cluster.now)

    async def look(name: str, times: int) -> list[JobFacts | None]:
        return [await directory.lookup("ml", name) for _ in range(times)]

    assert asyncio.run(look("demo", 5)) == [JobFacts("u1", 1)] * 5
    assert asyncio.run(look("ghost", 5)) == [None] * 5
    assert cluster.gets == 2
    cluster.stored[("ml", "demo")] = body("u1", 2)
    cluster.now += LOOKUP_SECONDS + 0.1
    assert asyncio.run(look("demo", 1)) == [JobFacts("u1", 2)] and cluster.gets == 3
