"""Chaos tests: the real control plane (tests/controlplane fixtures) plus faults.

CI sizes are small (the whole directory runs in well under 3 minutes on 2 cores); FTJOB_CHAOS_FULL=1
switches to the full sizes (100 jobs under SIGKILLs, 2000 generated specs).
"""

from __future__ import annotations

import os

from tests.controlplane.conftest import cluster, kubectl, namespace  # noqa: F401  (fixtures)
from tests.controlplane.operator.conftest import crd, operator, pytest_runtest_makereport  # noqa: F401

FULL = os.environ.get("FTJOB_CHAOS_FULL") == "1"


def size(ci: int, full: int) -> int:
    return full if FULL else ci
