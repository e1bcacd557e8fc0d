"""Real TRL + PEFT training of the tiny model through `accelerate launch`, 2 processes, on CPU.

ZeRO-3 (DeepSpeed, `DS_ACCELERATOR=cpu`) and plain DDP both lower the loss, and the saved adapter, loaded
with `PeftModel.from_pretrained` on the base model, reproduces the logits the trained model produced on the
probe text (the trainer writes them when `output.probePath` is set). Two "nodes" rendezvous on loopback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.hub_server import HubServer
from tests.fixtures.progress_server import ProgressServer
from tests.trainer.launching import (
    DDP_FILES,
    ZERO3_FILES,
    Launch,
    free_port,
    launch,
    losses,
    port_in_use,
    run,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.trainer


def assert_loss_went_down(run_dir: Path) -> None:
    by_step = losses(run_dir)
    steps = sorted(by_step)
    first, last = by_step[steps[0]], by_step[steps[-1]]
    assert len(steps) >= 10, by_step
    assert last < first - 1.0, f"loss did not go down enough: {by_step}"


def assert_adapter_reproduces_probe(run_dir: Path) -> None:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from finetune_trainer import builtin

    probe = load_file(str(run_dir / "probe.safetensors"))
    base = AutoModelForCausalLM.from_pretrained(builtin.resolve_model(builtin.TINY_LLAMA), dtype=torch.float32)
    untrained = base(input_ids=probe["input_ids"]).logits
    model = PeftModel.from_pretrained(base, str(run_dir / "checkpoints" / "adapter")).eval()
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"]).logits
    assert not torch.allclose(untrained, probe["logits"], atol=1e-3), "the adapter changed nothing"
    torch.testing.assert_close(logits, probe["logits"], atol=1e-4, rtol=1e-4)


def test_zero3_two_processes_lowers_loss_and_saves_a_faithful_adapter(
    zero3_run: Path, trainer_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FTJOB_CACHE", trainer_env["FTJOB_CACHE"])
    assert_loss_went_down(zero3_run)
    assert_adapter_reproduces_probe(zero3_run)
    card = (zero3_run / "checkpoints" / "adapter" / "README.md").read_text()
    assert "train_loss" in card and "loss.png" in card


def test_ddp_two_processes_trains_reports_progress_and_pushes(
    tmp_path: Path, trainer_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FTJOB_CACHE", trainer_env["FTJOB_CACHE"])
    token_file = tmp_path / "progress-token"
    token_file.write_text("projected-sa-token\n")
    with HubServer() as hub, ProgressServer() as progress:
        config = write_config(
            tmp_path,
            strategy={"numProcesses": 2, "zeroStage": 0, "useCpu": True},
            output={"hub": {"repoId": "org/tiny-ddp", "endpoint": hub.endpoint, "strategy": "checkpoint"}},
        )
        env = {
            # The fake Hub is a network endpoint: datasets' offline switch would turn huggingface_hub offline too.
            "HF_HUB_OFFLINE": "0",
            "HF_DATASETS_OFFLINE": "0",
            "HF_TOKEN": "hf_ddp_token",
            "FTJOB_PROGRESS_URL": progress.url,
            "FTJOB_PROGRESS_TOKEN_FILE": str(token_file),
        }
        job = run(config, trainer_env, files=DDP_FILES, extra_env=env)
        files = set(hub.repos["org/tiny-ddp"].files)
        commits = list(hub.repos["org/tiny-ddp"].commits)
        reports = list(progress.reports)
    assert "2 processes" in job.text() and "hf_ddp_token" not in job.text()
    assert_loss_went_down(tmp_path)
    assert_adapter_reproduces_probe(tmp_path)
    assert {"adapter_model.safetensors", "adapter_config.json", "README.md", "loss.png"} <= files
    # strategy "checkpoint": each save pushes the adapter and the resumable checkpoint under last-checkpoint/
    assert {"last-checkpoint/adapter_model.safetensors", "last-checkpoint/trainer_state.json"} <= files
    assert commits[0] == "checkpoint at step 4" and commits[-1].endswith("adapter after step 12")
    assert set(progress.tokens) == {"Bearer projected-sa-token"}
    steps = [r["progress"] for r in reports if "progress" in r]
    assert steps[-1]["step"] == steps[-1]["totalSteps"] == 12 and steps[-1]["percent"] == 100
    assert {"loss", "learningRate", "tokensPerSecond", "etaSeconds", "updatedAt"} <= set(steps[-1])
    assert reports[-1]["output"]["hubRepo"] == "org/tiny-ddp"


def test_two_nodes_rendezvous_on_loopback_and_merge_under_zero3(
    tmp_path: Path, trainer_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FTJOB_CACHE", trainer_env["FTJOB_CACHE"])
    config = write_config(
        tmp_path,
        training={"maxSteps": 4, "saveStrategy": "no", "mergeAdapter": True},
        strategy={"numMachines": 2, "numProcesses": 2, "zeroStage": 3, "useCpu": True},
    )
    port = free_port()

    def node(rank: int) -> Launch:
        return launch(config, trainer_env, files=ZERO3_FILES, num_processes=2, num_machines=2, machine_rank=rank,
                      port=port, log_name=f"node{rank}.log")  # fmt: skip

    # Node 0 first, as the operator's headless Service implies: on one host both agents would "match" the
    # endpoint's hostname and race to host the c10d store, and accelerate's rank-0 port check then fails.
    nodes = [node(0)]
    wait_for(lambda: port_in_use(port), timeout=120, what="node 0's rendezvous store", job=nodes[0])
    nodes.append(node(1))
    codes = [node.wait(300) for node in nodes]
    assert codes == [0, 0], "\n".join(node.text()[-3000:] for node in nodes)
    assert "2 processes on 2 machines" in nodes[0].text()
    state = json.loads((tmp_path / "checkpoints" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    assert_adapter_reproduces_probe(tmp_path)

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    probe = load_file(str(tmp_path / "probe.safetensors"))
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "checkpoints" / "merged"), dtype=torch.float32)
    with torch.no_grad():
        logits = merged.eval()(input_ids=probe["input_ids"]).logits
    torch.testing.assert_close(logits, probe["logits"], atol=1e-4, rtol=1e-4)
