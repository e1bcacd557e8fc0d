"""Every example validates, renders and plans (kopf runs all of its examples; so do we)."""

from pathlib import Path

import pytest

from finetune_operator.cli import main

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_renders_and_plans(example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(example), "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} >= {"accelerate.yaml", "trainer.json", "manifests.yaml"}
    assert main(["plan", str(example)]) == 0
    out = capsys.readouterr().out
    assert "strategy          ZeRO-" in out and "total" in out
