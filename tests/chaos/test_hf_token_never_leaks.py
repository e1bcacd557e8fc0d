"""No HF token ever leaves its Secret: not in a ConfigMap, Event, FineTuneJob status, Job, pod,
Service, the operator's log or its /metrics (neither plain nor base64)."""

from __future__ import annotations

import base64
import random
import string

import pytest

from tests.controlplane.conftest import Cluster
from tests.controlplane.operator.conftest import Operator, apply, ftj, wait_phase

pytestmark = pytest.mark.controlplane


def test_hf_token_appears_nowhere(cluster: Cluster, namespace: str, operator: Operator) -> None:
    token = "hf_" + "".join(random.Random().choice(string.ascii_letters) for _ in range(34))
    cluster.kubectl("-n", namespace, "create", "secret", "generic", "hf-token", f"--from-literal=token={token}")
    ref = {"name": "hf-token", "key": "token"}
    for name, example, fail in (
        ("tok-ok", "tiny-cpu", False),
        ("tok-gang", "llama-70b-lora-2x8", False),
        ("tok-fail", "tiny-cpu", True),
    ):
        body = ftj(example, name=name, run_seconds=2, fail=fail, backoffLimit=1)
        body["spec"]["model"]["tokenSecretRef"] = ref
        body["spec"]["output"]["hub"] = {
            "repoId": f"my-org/{name}",
            "private": True,
            "strategy": "checkpoint",
            "tokenSecretRef": ref,
        }
        apply(cluster, namespace, body)
    wait_phase(cluster, namespace, "Succeeded", name="tok-ok", timeout=90)
    wait_phase(cluster, namespace, "Succeeded", name="tok-gang", timeout=90)
    wait_phase(cluster, namespace, "Failed", name="tok-fail", timeout=90)

    needles = {token, base64.b64encode(token.encode()).decode(), token[3:]}
    places = {
        kind: cluster.kubectl("-n", namespace, "get", kind, "-o", "json").stdout
        for kind in ("configmaps", "events", "finetunejobs", "jobs", "pods", "services", "endpoints")
    }
    places["events (all namespaces)"] = cluster.kubectl("get", "events", "-A", "-o", "json").stdout
    places["operator log"] = operator.log_path.read_text(errors="replace")
    places["operator /metrics"] = operator.metrics()
    # sanity: the needle search works (the Secret itself does hold it, base64)
    secret = cluster.kubectl("-n", namespace, "get", "secret", "hf-token", "-o", "json").stdout
    assert base64.b64encode(token.encode()).decode() in secret
    # the pods do reference the Secret (so the token path is exercised), by name only
    assert '"hf-token"' in places["pods"]
    hits = [(where, n[:6] + "...") for where, text in places.items() for n in needles if n in text]
    assert hits == []
