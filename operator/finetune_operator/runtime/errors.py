"""The runtime's own retry signal.

`RetryLaterError` says "this round cannot finish now; run it again in `delay` seconds", for causes that are
not the job's fault (the API server throttles or restarts, a deleted namesake's children are not yet
garbage-collected). The work queue catches it and files a wake-up; nothing else needs to know it.
It used to be `kopf.TemporaryError`, borrowed for the same meaning, but the rounds do not run inside a
kopf handler (the queue runs them, and wake-ups have no kopf handler at all), so kopf never saw it: a
name of our own says who handles it.
"""


class RetryLaterError(Exception):
    """A round failed for a passing reason: run it again after `delay` seconds (whatever triggered it)."""

    def __init__(self, message: str, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay
