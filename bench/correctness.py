"""Correctness of rendered jobs on GPUs: 2 local "nodes" x 1 GPU, exactly the node commands `ftjob render` gives.

For each configuration (ZeRO-2, ZeRO-3, ZeRO-3 + CPU optimizer offload, QLoRA nf4 + ZeRO-3) on the built-in tiny
Llama and its arithmetic chat data:
  * trains: both nodes exit 0, the loss falls;
  * saves a non-empty adapter: every tensor in adapter_model.safetensors has elements, lora_B is not all zero;
  * reloads: in a fresh process, base model (+ the same 4-bit quantization) + PeftModel.from_pretrained reproduces
    the logits the trainer wrote at the end of training (output.probePath), and differ from the base model's;
and for each of them a resume test (`*_resume`): node 1's process group is SIGKILLed mid-training, node 0 gets SIGTERM then SIGKILL
(what deleting the attempt's Job does), both are relaunched, and the run must resume from the newest *complete*
checkpoint, finish, and its adapter must pass the same reload check.
The only change to the rendered files is `output.probePath` in trainer.json (a test-only field).

    python3 bench/correctness.py --out $OUT [--only c_zero3,...] [--budget 300]
Writes $OUT/correctness.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / p) for p in ("api", "operator", "trainer")]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as H  # noqa: E402

WORK = Path(os.environ.get("BENCH_WORK", "/tmp/bench/work")) / "correctness"
QUANT = {"quantType": "nf4", "doubleQuant": True, "computeDtype": "bfloat16", "storageDtype": "bfloat16"}


def job(name: str, *, zero: int = 3, steps: int = 30, save_steps: int = 10, extra: dict | None = None,
        gpus: int = 1, nodes: int = 2) -> dict[str, Any]:
    spec = {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "builtin:tiny-llama", "attnImplementation": "sdpa"},
            "dataset": {"name": "builtin:tiny-chat", "splits": ["train"], "textField": "content", "maxSeqLen": 128,
                        "packing": True},
            "adapter": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "targetModules": "all-linear"},
            "training": {"maxSteps": steps, "learningRate": 3e-3, "lrSchedulerType": "constant",
                         "perDeviceTrainBatchSize": 4, "gradientAccumulationSteps": 1, "gradientCheckpointing": True,
                         "useReentrant": False, "mixedPrecision": "bf16", "seed": 7, "loggingSteps": 5,
                         "evalStrategy": "no", "saveStrategy": "steps", "saveSteps": save_steps,
                         "saveTotalLimit": 2},
            "distributed": {"nodes": nodes, "gpusPerNode": gpus, "gpuMemoryGiB": 140,
                            "deepspeed": {"zeroStage": zero},
                            "rendezvous": {"backend": "c10d", "port": H.next_port(), "maxRestarts": 0,
                                           "timeoutSeconds": 120}},
            "output": {"checkpoints": {"emptyDir": {}}},
        },
    }
    if os.environ.get("BENCH_CPU") == "1":  # logic check of this script on a CPU-only machine
        spec["spec"]["distributed"].update({"gpusPerNode": 0, "processesPerNode": 1})
        spec["spec"]["training"]["mixedPrecision"] = "no"
    return H.deep_merge(spec, extra or {})


CONFIGS = {
    "c_zero2": lambda: job("c-zero2", zero=2),
    "c_zero3": lambda: job("c-zero3", zero=3),
    "c_zero3_offload": lambda: job("c-zero3-offload", zero=3, extra={"spec": {"distributed": {"deepspeed": {
        "offloadOptimizer": "cpu"}}}}),
    "c_qlora_zero3": lambda: job("c-qlora-zero3", zero=3, extra={"spec": {"model": {"quantization": QUANT}}}),
}

CHECK_SCRIPT = r'''
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import PeftModel
model_path, adapter, probe_path, quant = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
out = {}
tensors = load_file(f"{adapter}/adapter_model.safetensors")
out["adapter_tensors"] = len(tensors)
out["adapter_empty_tensors"] = [k for k, v in tensors.items() if v.numel() == 0]
out["lora_B_abs_sum"] = float(sum(v.float().abs().sum() for k, v in tensors.items() if "lora_B" in k))
probe = load_file(probe_path)
kw = dict(dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32)
if quant:
    kw["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    kw["device_map"] = {"": 0}
base = AutoModelForCausalLM.from_pretrained(model_path, **kw)
dev = "cuda" if torch.cuda.is_available() else "cpu"
if not quant:
    base = base.to(dev)
model = PeftModel.from_pretrained(base, adapter).eval()
ids = probe["input_ids"].to(dev)
with torch.no_grad():
    got = model(input_ids=ids).logits.float().cpu()
    with model.disable_adapter():
        base_logits = model(input_ids=ids).logits.float().cpu()
ref = probe["logits"].float()
out["rel_err_vs_trainer"] = float((got - ref).norm() / ref.norm())
out["rel_diff_base_vs_trainer"] = float((base_logits - ref).norm() / ref.norm())
out["same_argmax_frac"] = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
print("CHECK_JSON " + json.dumps(out))
'''


def model_path() -> str:
    cache = os.environ.get("FTJOB_CACHE", "/tmp/ftjob-cache")
    return str(Path(cache) / "builtin" / "tiny-llama")


def check_adapter(run: H.RenderedRun, quant: bool, log: Any) -> dict[str, Any]:
    adapter = Path(run.rendered.trainer.output.adapter_dir)
    probe = run.workdir / "probe.safetensors"
    res: dict[str, Any] = {"adapter_dir_exists": adapter.is_dir(), "probe_exists": probe.exists()}
    if not (adapter.is_dir() and probe.exists()):
        return res
    env = H.base_env({"CUDA_VISIBLE_DEVICES": "0"})
    p = subprocess.run([H.PY, "-c", CHECK_SCRIPT, model_path(), str(adapter), str(probe), "1" if quant else "0"],
                       env=env, capture_output=True, text=True, timeout=240)
    line = next((x for x in p.stdout.splitlines() if x.startswith("CHECK_JSON ")), None)
    if line is None:
        res["check_error"] = (p.stdout + p.stderr)[-2000:]
        return res
    res.update(json.loads(line[len("CHECK_JSON "):]))
    return res


def reload_ok(res: dict[str, Any]) -> bool:
    """Non-empty adapter that changes the model, and reloads to the trainer's own logits."""
    return bool(
        res.get("adapter_tensors", 0) > 0 and not res.get("adapter_empty_tensors") and res.get("lora_B_abs_sum", 0) > 0
        and res.get("rel_err_vs_trainer", 1) < 2e-2
        and res.get("rel_diff_base_vs_trainer", 0) > 5 * res.get("rel_err_vs_trainer", 1)
    )


def losses_from_log(path: Path) -> list[float]:
    return [float(m) for m in re.findall(r"'loss': '?([0-9.]+)'?", path.read_text(errors="replace"))]


def run_config(name: str, out: Path, log: Any, budget_left: float) -> dict[str, Any]:
    spec = CONFIGS[name]()
    wd = WORK / name
    run = H.render_job(spec, wd, timed=False, trainer_updates={"output": {"probePath": str(wd / "probe.safetensors")}})
    quant = "quantization" in spec["spec"]["model"]
    t = time.time()
    procs = H.start_nodes(run)
    codes = H.wait_all(procs, min(300, budget_left))
    for p in procs:
        p.close()
    res: dict[str, Any] = {"name": name, "rc": codes, "wall_s": round(time.time() - t, 1),
                           "plan": f"ZeRO-{run.plan.strategy.zero_stage}/{run.plan.strategy.offload}",
                           "accelerate_yaml": run.files.get("accelerate.yaml")}
    losses = losses_from_log(wd / "node0.log")
    res["losses"] = losses
    res["loss_fell"] = len(losses) >= 2 and losses[-1] < losses[0]
    if codes == [0, 0]:
        res.update(check_adapter(run, quant, log))
    res["ok"] = bool(codes == [0, 0] and res["loss_fell"] and reload_ok(res))
    if not res["ok"]:
        res["tail_node0"] = H.tail(wd / "node0.log", 30)
        res["tail_node1"] = H.tail(wd / "node1.log", 15)
    return res


def newest_complete(root: Path) -> tuple[int | None, list[str]]:
    steps, names = [], []
    for p in sorted(root.glob("checkpoint-*")):
        names.append(p.name + ("" if (p / "checkpoint-complete.json").exists() else " (no marker)"))
        m = re.match(r"checkpoint-(\d+)$", p.name)
        if m and (p / "checkpoint-complete.json").exists():
            steps.append(int(m.group(1)))
    return (max(steps) if steps else None), names


RESUMABLE = {  # config -> (job name, spec changes): each is killed mid-run and resumed
    "c_zero3_resume": ("c-zero3-resume", {}),
    "c_zero2_resume": ("c-zero2-resume", {"spec": {"distributed": {"deepspeed": {"zeroStage": 2}}}}),
    "c_zero3_offload_resume": ("c-zero3-offload-resume",
                               {"spec": {"distributed": {"deepspeed": {"offloadOptimizer": "cpu"}}}}),
    "c_qlora_zero3_resume": ("c-qlora-zero3-resume", {"spec": {"model": {"quantization": QUANT}}}),
}


def run_resume(name: str, out: Path, log: Any, budget_left: float) -> dict[str, Any]:
    """Kill node 1 mid-training; relaunch both; the run resumes from the newest complete checkpoint, finishes, and
    its adapter reloads to the logits the resumed trainer wrote."""
    job_name, extra = RESUMABLE[name]
    spec = job(job_name, zero=3, steps=60, save_steps=10, extra=extra)
    quant = "quantization" in spec["spec"]["model"]
    wd = WORK / name
    probe = {"output": {"probePath": str(wd / "probe.safetensors")}}
    run = H.render_job(spec, wd, timed=False, trainer_updates=probe)
    ckpt = run.checkpoint_dir
    res: dict[str, Any] = {"name": name, "plan": f"ZeRO-{run.plan.strategy.zero_stage}/{run.plan.strategy.offload}"}
    t0 = time.time()
    procs = H.start_nodes(run, log_prefix="attempt1-")
    killed_at = None
    while time.time() - t0 < min(200, budget_left / 2):
        step, _ = newest_complete(ckpt)
        if step is not None and step >= 20:
            procs[1].kill_group(signal.SIGKILL)  # node 1 lost (pod/node died)
            killed_at = step
            break
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.3)
    res["newest_complete_when_node1_killed"] = killed_at
    time.sleep(3)
    procs[0].terminate_launcher()  # the operator deletes the attempt's Job: pods get SIGTERM...
    time.sleep(10)
    procs[0].kill_group(signal.SIGKILL)  # ...and SIGKILL after the grace period
    for p in procs:
        p.close()
    H.kill_leftovers(log)
    res["attempt1_rc"] = [p.poll() for p in procs]
    before, listing = newest_complete(ckpt)
    res["checkpoints_before_relaunch"] = listing
    res["expected_resume_step"] = before
    if killed_at is None or before is None:
        res["ok"] = False
        res["error"] = "node 1 was not killed mid-training (no complete checkpoint >= 20 in time)"
        res["tail_node0"] = H.tail(wd / "attempt1-node0.log", 30)
        return res
    # attempt 2: the same job (same checkpoint volume), rendered again; a fresh port because this host's old one can
    # sit in TIME_WAIT (in a cluster attempt n+1 gets new pods and addresses)
    spec["spec"]["distributed"]["rendezvous"]["port"] = H.next_port()
    run = H.render_job(spec, wd, timed=False, trainer_updates=probe)
    procs = H.start_nodes(run, log_prefix="attempt2-", extra_env={"FTJOB_ATTEMPT": "2"})
    codes = H.wait_all(procs, min(240, budget_left - (time.time() - t0)))
    for p in procs:
        p.close()
    res["attempt2_rc"] = codes
    text = (wd / "attempt2-node0.log").read_text(errors="replace")
    m = re.search(r"resuming from (\S*checkpoint-(\d+))", text)
    res["resumed_from_step"] = int(m.group(2)) if m else None
    res["torn_set_aside"] = sorted(p.name for p in ckpt.glob("torn-checkpoint-*"))
    res["adapter_written"] = (ckpt / "adapter" / "adapter_model.safetensors").exists()
    _, res["checkpoints_after"] = newest_complete(ckpt)
    g = re.findall(r"'epoch': '?([0-9.]+)", text)
    res["last_epoch_logged"] = g[-1] if g else None
    if codes == [0, 0]:
        res.update(check_adapter(run, quant, log))
    res["ok"] = bool(codes == [0, 0] and res["resumed_from_step"] == before and res["adapter_written"]
                     and reload_ok(res))
    if not res["ok"]:
        res["tail_node0"] = H.tail(wd / "attempt2-node0.log", 40)
    res["wall_s"] = round(time.time() - t0, 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--only", default=None)
    ap.add_argument("--budget", type=float, default=330)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    names = [*CONFIGS, *RESUMABLE]
    if a.only:
        names = [n for n in names if n in a.only.split(",")]

    def log(msg: str) -> None:
        print(f"[correctness +{time.time() - t0:4.0f}s] {msg}", flush=True)

    for n in names:
        left = a.budget - (time.time() - t0)
        if left < 40:
            H.append_jsonl(out / "correctness.jsonl", {"name": n, "ok": False, "error": "skipped: out of budget"})
            continue
        log(f"start {n}")
        try:
            res = run_resume(n, out, log, left) if n in RESUMABLE else run_config(n, out, log, left)
        except Exception as e:
            res = {"name": n, "ok": False, "error": f"{type(e).__name__}: {e}"}
        log(f"{n}: ok={res.get('ok')} " + json.dumps({k: v for k, v in res.items()
                                                       if k not in ("tail_node0", "tail_node1", "accelerate_yaml")})[:600])
        H.append_jsonl(out / "correctness.jsonl", res)


if __name__ == "__main__":
    main()
