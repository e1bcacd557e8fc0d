"""Security tests on the real control plane: the fixtures of tests/controlplane (cluster, namespace, a running
`ftjob operator`) and of tests/chart (helm, an installed release), re-exported so these tests share one session
cluster with them. Every test here is marked `controlplane` in its module."""

from __future__ import annotations

from tests.chart.conftest import helm, install  # noqa: F401  (fixtures)
from tests.controlplane.conftest import cluster, kubectl, namespace  # noqa: F401  (fixtures)
from tests.controlplane.operator.conftest import crd, operator, pytest_runtest_makereport  # noqa: F401
