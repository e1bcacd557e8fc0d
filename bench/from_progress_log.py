"""Step times of `ours` jobs whose timer did not attach (bench run 2), from the trainer's own progress log.

finetune_trainer.progress logs `step N/M` on rank 0 at every logged step (loggingSteps 1 in the bench jobs), with
millisecond timestamps, after TRL's per-step `.item()` metrics have synchronised with the GPU. The mean of the last 8
intervals between consecutive step lines gives the step time (as the seed timer does, without its explicit
torch.cuda.synchronize). Writes rows in the results schema (no memory figures: none were recorded).

    python3 bench/from_progress_log.py RESULTS_DIR LOGS_DIR NAME [NAME ...]
"""

import datetime
import json
import re
import statistics
import sys
from pathlib import Path

LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[rank0\] INFO finetune_trainer\.progress: step (\d+)/(\d+)")


def main() -> None:
    out_dir, logs, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    runs = {}
    for x in (out_dir / "ours_runs.jsonl").read_text().splitlines():
        r = json.loads(x)
        runs[r["name"]] = r
    with open(out_dir / "results_from_logs.jsonl", "w") as f:
        for name in names:
            text = (logs / name / "node0.log").read_text(errors="replace")
            first = {}
            for m in LINE.finditer(text):
                ts = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                first.setdefault(int(m.group(2)), ts)
            steps = sorted(first)
            iv = [first[b] - first[a] for a, b in zip(steps, steps[1:], strict=False)]
            last = iv[-8:]
            levers = re.search(r"speed levers applied: ([\w, ]+)", text)
            world = 2
            step_s = statistics.mean(last)
            row = dict(
                name=name, ok=True, impl="ours", timing="progress-log timestamps (rank 0), no explicit sync",
                backend=f"deepspeed-zero{runs[name]['plan']['zero_stage']}" if runs[name]["plan"]["zero_stage"]
                else "ddp", world=world, bsz=4, grad_accum=1, seq=2048, doc_len=2048, steps=len(steps), measure=8,
                layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, vocab=128256,
                n_trainable=20971520, packing_strategy="bfd", gradient_checkpointing=name.startswith("mem_"),
                levers_applied=[x.strip() for x in levers.group(1).split(",")] if levers else [],
                step_s=step_s, step_s_min=min(last), step_s_max=max(last), intervals=iv,
                tokens_per_step_per_gpu=8192, tokens_per_s_per_gpu=8192 / step_s,
                ranks=[{"max_mem_alloc_gib": float("nan"), "max_mem_reserved_gib": float("nan")}],
            )
            f.write(json.dumps(row) + "\n")
            print(f"{name}: {len(steps)} steps, last intervals {[round(x, 3) for x in last]} -> "
                  f"{step_s:.4f} s/step, {8192 / step_s:,.0f} tokens/s/GPU")


if __name__ == "__main__":
    main()
