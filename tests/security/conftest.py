"""Fixtures for the security tests: the real control plane's `cluster`, `kubectl` and `namespace`, the
FineTuneJob CRD (`crd`), all re-exported from tests/controlplane so that every directory shares one
session cluster. Every test here is marked ``controlplane``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.controlplane.conftest import cluster, kubectl, namespace
from tests.controlplane.operator.conftest import crd

__all__ = ["cluster", "crd", "kubectl", "namespace"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.controlplane)
