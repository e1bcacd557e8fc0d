"""Values cases rendered by the chart tests (and snapshotted in tests/chart/snapshots/<case>.yaml)."""

from __future__ import annotations

from typing import Any

CASES: dict[str, dict[str, Any]] = {
    # What `helm install ftjob charts/finetune-operator` gives: cluster-wide, 2 replicas, peering.
    "default": {},
    # Namespaced mode: a Role + RoleBinding and a KopfPeering in each watched namespace.
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    # Every optional switch flipped: no peering (one replica), a ServiceMonitor, a cert from
    # cert-manager, a Grafana dashboard, no aggregated roles, extra flags, scheduling knobs, a looser pod policy.
    "features": {
        "replicas": 1,
        "peering": {"enabled": False},
        "trainer": {"image": "registry.example.com/ml/trainer:1.2.3"},
        "image": {"tag": "dev", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "metrics": {
            "port": 9090,
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "dashboard": {"enabled": True, "annotations": {"grafana_folder": "Fine-tuning"}},
        },
        "progress": {"port": 8443, "tls": {"existingSecret": "ftjob-progress-cert"}},
        "rbac": {"aggregateToDefaultRoles": False},
        "verbose": True,
        "extraArgs": ["--some-future-flag=1"],
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"example.com/team": "ml-platform"},
        "podPolicy": {
            "allowedImages": ["registry.example.com/ml/"],
            "allowedServiceAccounts": ["default", "trainer"],
            "allowedTolerations": ["nvidia.com/gpu", "dedicated"],
            "securityLevel": "baseline",
        },
    },
    # The local cluster (README.md, "Run it on a local cluster"): images from `make images`, never pulled, one
    # replica, the operator on the real node, and jobs allowed to tolerate that node's taint. README's values
    # block must stay equal to this (tests/chart/test_local_values.py).
    "local-node": {
        "image": {"repository": "localhost/finetune-operator/operator", "tag": "dev", "pullPolicy": "Never"},
        "trainer": {"image": "localhost/finetune-operator/trainer:dev"},
        "replicas": 1,
        "nodeSelector": {"finetune.dev/real-node": "true"},
        "tolerations": [
            {"key": "finetune.dev/real-node", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        ],
        "podPolicy": {
            "allowedTolerations": [
                "nvidia.com/gpu",
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable",
                "finetune.dev/real-node",
            ]
        },
    },
}
