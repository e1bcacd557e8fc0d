"""Rounds that run in a task of their own, outside the call that started them.

Two callers start a reconcile and must not wait for it: the wake-up task (one slow round on a saturated API
server must not hold every other job's wake-up behind it) and a child's index function (kopf stores the index
entry only when the function returns, and the round reads it). `detach` keeps a strong reference to each such
task until it ends (the event loop keeps only weak ones) and logs a failure with the task's name, since nobody
awaits it. The work queue serializes rounds per job, so running them side by side is safe.
"""

import asyncio
import logging
from collections.abc import Coroutine
from functools import partial
from typing import Any

log = logging.getLogger(__name__)


def detach(running: "set[asyncio.Task[None]]", round_: Coroutine[Any, Any, None], name: str) -> None:
    """Run `round_` in a task named `name`, held in `running` until it ends; a failure is logged."""
    task = asyncio.get_running_loop().create_task(round_, name=name)
    running.add(task)
    task.add_done_callback(partial(_ended, running))


def _ended(running: "set[asyncio.Task[None]]", task: "asyncio.Task[None]") -> None:
    running.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed", task.get_name(), exc_info=task.exception())
