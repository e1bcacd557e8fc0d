"""Markdown tables from bench results: throughput + MFU, ours vs seed in the same run, memory vs the planner.

    python3 bench/summarize.py bench/results/run1 [bench/results/run2 ...]

Each argument is one run's result directory; its name (run1, run2, ...) labels that run's rows.

Figures (bench/README.md gives the formulas): tokens/s/GPU = tokens per GPU per optimizer step / mean step time of
the last `measure` steps (slowest rank); MFU = F_model x tokens/s/GPU / 989e12 with F_model from the seed script's
flops_per_token (no recompute); HFU adds the checkpointing recompute only for runs with checkpointing on (the seed
script adds it for every run; here it is 0 extra for runs without checkpointing). Peak device memory =
max_memory_reserved + (memory the device reports used - reserved, at the end) = the allocator's peak plus the CUDA
context, NCCL buffers and other non-PyTorch allocations.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("seed_baseline", HERE / "seed" / "seed_baseline.py")
seed = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(seed)  # type: ignore[union-attr]
PEAK = 989e12


def load(d: Path) -> tuple[list[dict], dict[str, dict], float | None]:
    rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines() if x.strip()]
    if (d / "results_from_logs.jsonl").exists():  # ours runs timed from the progress log (run 2)
        logged = [json.loads(x) for x in (d / "results_from_logs.jsonl").read_text().splitlines() if x.strip()]
        names = {r["name"] for r in logged}
        rows = [r for r in rows if r["name"] not in names] + logged
    runs = {}
    if (d / "ours_runs.jsonl").exists():
        for x in (d / "ours_runs.jsonl").read_text().splitlines():
            if x.strip():
                r = json.loads(x)
                runs[r["name"]] = r
    mm = None
    if (d / "matmul.json").exists():
        mm = json.loads((d / "matmul.json").read_text())["tflops_mean"]
    return rows, runs, mm


def peak_device(r: dict) -> float | None:
    used, resv_end = r.get("device_used_at_end_gib"), r.get("reserved_at_end_gib")
    if "max_mem_reserved_gib" not in r:
        return None
    if used is None or resv_end is None:
        return None
    return r["max_mem_reserved_gib"] + (used - resv_end)


def throughput_table(label: str, rows: list[dict], mm: float | None) -> list[str]:
    out = [f"\n### {label}: throughput (8192 tokens per GPU per step, seq 2048, LoRA r=8 all-linear)\n",
           "| run | impl | backend | GPUs | levers | ckpt | s/step (min-max) | tokens/s/GPU | MFU (989) | "
           f"MFU (meas. {mm or 0:.0f}) | HFU (989) | peak alloc GiB | peak device GiB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r.get("ok"):
            out.append(f"| {r['name']} | FAILED: {r.get('error', '')[:90]} |" + " |" * 11)
            continue
        mfu_f, hfu_f, _, _ = seed.flops_per_token(r)
        gc = r.get("gradient_checkpointing", True)
        # the recompute is of the checkpointed layers only: all of them, or the planner's partial count
        part = r["ranks"][0].get("checkpointed_layers") if r.get("ranks") else None
        share = (part / r["layers"] if part else 1.0) if gc else 0.0
        hfu_f = mfu_f + (hfu_f - mfu_f) * share
        ckpt = "off" if not gc else (f"{part}/{r['layers']}" if part else "on")
        tps = r["tokens_per_s_per_gpu"]
        alloc = max(x.get("max_mem_alloc_gib", float("nan")) for x in r["ranks"])
        dev = [peak_device(x) for x in r["ranks"]]
        dev_s = f"{max(dev):.1f}" if all(v is not None for v in dev) else "-"
        lev = ",".join(r.get("levers_applied", [])) or ("liger" if r.get("liger") else "-")
        out.append(
            f"| {r['name']} | {r.get('impl', 'seed')} | {r['backend']} | {r['world']} | {lev} | "
            f"{ckpt} | {r['step_s']:.3f} ({r['step_s_min']:.2f}-{r['step_s_max']:.2f}) | "
            f"{tps:,.0f} | {mfu_f * tps / PEAK * 100:.1f}% | "
            f"{(mfu_f * tps / (mm * 1e12) * 100) if mm else float('nan'):.1f}% | {hfu_f * tps / PEAK * 100:.1f}% | "
            f"{alloc:.1f} | {dev_s} |")
    return out


def ratio_lines(label: str, rows: list[dict], prefix: str) -> list[str]:
    seeds = [r["tokens_per_s_per_gpu"] for r in rows if r.get("ok") and r.get("impl") != "ours"
             and r["name"].startswith("A_zero3")]
    ours = [r["tokens_per_s_per_gpu"] for r in rows if r.get("ok") and r["name"].startswith(prefix)]
    if not seeds or not ours:
        return []
    sm, om = statistics.median(seeds), statistics.median(ours)
    return [f"\n{label}: seed recipe (A, ZeRO-3) runs {', '.join(f'{x:,.0f}' for x in seeds)} tokens/s/GPU "
            f"(median {sm:,.0f}); ours ({prefix}*) {', '.join(f'{x:,.0f}' for x in ours)} (median {om:,.0f}); "
            f"ratio of medians {om / sm:.2f}x, worst pair {min(ours) / max(seeds):.2f}x, "
            f"best pair {max(ours) / min(seeds):.2f}x."]


# GPUs shared with the correctness suite (run 3): the device's used memory includes other processes, so the peak is
# max_memory_reserved + the non-PyTorch memory of an exclusive 2-GPU run (run 1: 70.12 - 68.56 GiB).
SHARED_RUNS = {"run3"}
NON_TORCH_GIB = 1.56


def current_estimates() -> dict[str, float]:
    """The planner's estimate today for every `ours` job of the bench plans (re-rendered specs)."""
    sys.path[:0] = [str(HERE.parent / "operator"), str(HERE.parent / "trainer"), str(HERE)]
    try:
        import run_bench as rb

        from finetune_api.v1alpha1.resource import FineTuneJob
        from finetune_operator.plan import plan_job
    except ImportError:
        return {}
    jobs = []
    for plan in (rb.plan_perf, rb.plan_memory, rb.plan_final):
        for j in plan():
            jobs += j.get("jobs", [j])
    return {j["name"]: plan_job(FineTuneJob.model_validate(j["spec"]).spec).estimate.total_gib
            for j in jobs if j.get("type") == "ours"}


def memory_table(all_rows: list[tuple[str, dict, dict]]) -> list[str]:
    now = current_estimates()
    out = ["\n### Planner estimate vs measured peak (our trainer)\n",
           "| run/job | strategy | GPUs | ckpt | levers | measured peak device GiB | max allocated GiB | "
           "plan at run time GiB | vs device | plan now GiB | vs device |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, r, run in all_rows:
        plan = run.get("plan", {})
        if not r.get("ok") or not plan or r.get("timing"):
            continue
        if label in SHARED_RUNS:
            dev = max(x["max_mem_reserved_gib"] for x in r["ranks"]) + NON_TORCH_GIB
        else:
            dev = max(v for v in (peak_device(x) for x in r["ranks"]) if v is not None)
        alloc = max(max(x["max_mem_alloc_gib"], x.get("max_mem_alloc_before_train_gib", 0)) for x in r["ranks"])
        est = plan["estimate_gib"]
        cur = now.get(r["name"])
        cur_s = f"{cur:.1f} | {(cur - dev) / dev * 100:+.0f}%" if cur is not None else "- | -"
        out.append(f"| {label}/{r['name']} | ZeRO-{plan['zero_stage']}/{plan['offload']} | {r['world']} | "
                   f"{'on' if r.get('gradient_checkpointing') else 'off'} | {','.join(r.get('levers_applied', []))} | "
                   f"{dev:.1f}{'*' if label in SHARED_RUNS else ''} | {alloc:.1f} | {est:.1f} | "
                   f"{(est - dev) / dev * 100:+.0f}% | {cur_s} |")
    return out


def main() -> None:
    mem_rows = []
    for arg in sys.argv[1:]:
        d = Path(arg)
        rows, runs, mm = load(d)
        print("\n".join(throughput_table(d.name, rows, mm)))
        for prefix in ("ours_final", "ours_best"):
            print("\n".join(ratio_lines(d.name, rows, prefix)))
        mem_rows += [(d.name, r, runs.get(r["name"], {})) for r in rows if r.get("impl") == "ours"]
    print("\n".join(memory_table(mem_rows)))


if __name__ == "__main__":
    main()
