"""Every example validates, renders and plans (kopf runs all of its examples; so do we)."""

from pathlib import Path

import pytest

from finetune_operator.cli import main
from finetune_operator.policy import PodPolicy

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
# Pod-policy flags an example needs beyond the operator's defaults: what its README section installs the chart
# with (tiny-cpu-node tolerates the local cluster's real node, README.md "Run it on a local cluster").
POLICY_FLAGS = {
    "tiny-cpu-node": [
        f"--allowed-toleration={key}" for key in (*PodPolicy().allowed_tolerations, "finetune.dev/real-node")
    ],
}


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_renders_and_plans(example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = POLICY_FLAGS.get(example.stem, [])
    assert main(["render", str(example), "--out", str(tmp_path), *flags]) == 0
    assert {p.name for p in tmp_path.iterdir()} >= {"accelerate.yaml", "trainer.json", "manifests.yaml"}
    assert main(["plan", str(example), *flags]) == 0
    out = capsys.readouterr().out
    assert "strategy          ZeRO-" in out and "total" in out
