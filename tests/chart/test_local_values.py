"""The chart values of the local flow (README.md, "Run it on a local cluster") land where they must.

The contract names `image.repository`, `image.tag`, `image.pullPolicy`, `trainer.image`, `replicas`,
`nodeSelector` and `tolerations` are what README.md and tests/e2e/node install the chart with; this checks that
README's values block is exactly the `local-node` case (also snapshotted), and what `helm template` makes of it.
"""

from __future__ import annotations

import re

import yaml

from finetune_operator.policy import PodPolicy

from .cases import CASES
from .conftest import REPO, Helm, documents, find

README_VALUES = re.compile(r"helm install ftjob charts/finetune-operator .*?-f - <<'EOF'\n(.*?)\nEOF\n", re.DOTALL)


def test_readme_installs_the_local_node_values() -> None:
    found = README_VALUES.findall((REPO / "README.md").read_text())
    assert len(found) == 1, "README.md should hold one `helm install ... -f - <<'EOF'` values block"
    assert yaml.safe_load(found[0]) == CASES["local-node"]


def test_local_node_values_reach_the_operator_pod(helm: Helm) -> None:
    values = CASES["local-node"]
    (deployment,) = find(documents(helm.template(values=values)), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 1
    assert container["image"] == "localhost/finetune-operator/operator:dev"
    assert container["imagePullPolicy"] == "Never"
    assert pod["nodeSelector"] == {"finetune.dev/real-node": "true"}
    assert pod["tolerations"] == values["tolerations"]
    assert "--image=localhost/finetune-operator/trainer:dev" in container["args"]
    # The policy keeps its defaults and adds the real node's taint, so jobs may tolerate it.
    allowed = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--allowed-toleration=")]
    assert allowed == [*PodPolicy().allowed_tolerations, "finetune.dev/real-node"]
