"""Golden files: tests/golden/cases/<case>/job.yaml -> the files `ftjob render` writes, byte for byte.

Record with `pytest tests/unit/test_render_golden.py --update-golden` and explain every change in the
commit message.
"""

from pathlib import Path

import pytest

from finetune_api import constants
from finetune_operator.cli import main

CASES_DIR = Path(__file__).resolve().parents[1] / "golden" / "cases"
CASES = sorted(p.name for p in CASES_DIR.iterdir() if (p / "job.yaml").exists())
OUTPUTS = [constants.ACCELERATE_FILE, constants.DEEPSPEED_FILE, constants.TRAINER_FILE, "manifests.yaml"]


@pytest.mark.parametrize("case", CASES)
def test_render_matches_golden(case: str, tmp_path: Path, update_golden: bool) -> None:
    case_dir = CASES_DIR / case
    argv = ["render", str(case_dir / "job.yaml"), "--out", str(tmp_path), "--image", "trainer:test"]
    assert main(argv) == 0
    for name in OUTPUTS:
        got, want = tmp_path / name, case_dir / name
        if update_golden:
            if got.exists():
                want.write_text(got.read_text())
            elif want.exists():
                want.unlink()
            continue
        assert got.exists() == want.exists(), f"{case}: {name} rendered={got.exists()} golden={want.exists()}"
        if got.exists():
            assert got.read_text() == want.read_text(), f"{case}/{name} differs from golden"


def test_every_case_covers_what_it_says() -> None:
    """The cases span ZeRO 0-3, CPU/NVMe offload, QLoRA, multi-node, overrides and auto."""
    assert {
        "zero0-ddp",
        "zero1",
        "zero2-offload-cpu",
        "zero3-nvme",
        "zero3-overrides",
        "auto-8b-fits-one-gpu",
        "qlora-multinode-progress",
        "example-llama-70b-lora-2x8",
    } <= set(CASES)
