"""accelerate itself accepts every rendered config: no unknown keys, no keys it forbids beside a JSON."""

from pathlib import Path

import pytest

from finetune_operator.cli import load_job
from finetune_operator.render import render_all

CASES = sorted((Path(__file__).resolve().parents[1] / "golden" / "cases").glob("*/job.yaml"))


@pytest.mark.parametrize("job_file", CASES, ids=[p.parent.name for p in CASES])
def test_accelerate_loads_the_rendered_config(job_file: Path, tmp_path: Path) -> None:
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    rendered = render_all(load_job(str(job_file)))
    path = tmp_path / "accelerate.yaml"
    path.write_text(rendered.files["accelerate.yaml"])
    config = config_args.load_config_from_file(str(path))
    assert config.num_processes == rendered.topology.num_processes
    assert str(config.distributed_type).endswith(rendered.accelerate["distributed_type"])
    if rendered.deepspeed is not None:
        owned_by_json = {
            "gradient_accumulation_steps",
            "gradient_clipping",
            "zero_stage",
            "offload_optimizer_device",
            "offload_param_device",
            "zero3_save_16bit_model",
        }
        assert not owned_by_json & set(config.deepspeed_config)
        assert config.mixed_precision in (None, "no")
