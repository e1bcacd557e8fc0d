#!/usr/bin/env python
"""Print the README's markdown tables from bench_operator.py result files.

$HOME/.cache/finetune-operator/venv/bin/python bench/operator/report.py bench/operator/results/<stamp>.json ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench_operator import series_table

MIB_PER_MB = 1.048576
# Frames every sample passes through (event loop, threads, entry point): no information in their share.
ROOTS = (
    "asyncio/",
    "threading.py",
    "selectors.py",
    "concurrent/",
    "(ftjob)",
    "finetune_operator/cli.py",
    "finetune_operator/handlers/main.py",
    "kopf/_core/reactor/running.py",
)


def single_rows(result: dict[str, Any]) -> list[str]:
    s = result["single"]
    rows = [
        f"single job, {s['runs']} runs, {result['kwok_nodes']} nodes ({result['date']})",
        "",
        "| | p50 | p99 (= max at 50 runs) | mean | min |",
        "|---|---|---|---|---|",
    ]
    for key, label in (("create_to_pods_s", "create -> both pods exist"), ("create_to_running_s", "create -> Running")):
        v = s[key]
        rows.append(f"| {label} | {v['p50']:.3f} s | {v['p99']:.3f} s | {v['mean']:.3f} s | {v['min']:.3f} s |")
    rows.append(f"\noperator peak RSS {s['operator_peak_rss_mib']:.0f} MiB")
    return rows


def burst_row(b: dict[str, Any], nodes: int) -> str:
    op, fl = b["operator"], b["floor"]
    n = b["jobs"]
    running = op["create_to_all_running_s"]
    tail_fl = fl["create_to_all_pods_s"] - fl["create_calls_s"]
    tail_op = op["create_to_all_pods_s"] - op["create_calls_s"]
    cells = [
        f"{n}",
        f"{nodes}",
        f"{fl['create_to_all_pods_s']:.2f} s",
        f"{op['create_to_all_pods_s']:.2f} s",
        f"**{b['ratio_operator_over_floor']:.2f}**",
        f"{running:.1f} s" if running is not None else "not reached",
        f"{fl['create_calls_s']:.1f} / {op['create_calls_s']:.1f} s",
        f"{tail_fl:.2f} / {tail_op:.2f} s",
        f"{op['operator_cpu_s_per_job']:.3f} s",
        f"{op['operator_peak_rss_mib']:.0f} MiB ({op['operator_peak_rss_mib'] * MIB_PER_MB:.0f} MB)",
        f"{b['requests_per_job_operator_run']:.1f}",
        f"{b['requests_per_job_floor_run']:.1f}",
        f"{b['requests_per_job_attributable_to_operator']:.1f}",
    ]
    return "| " + " | ".join(cells) + " |"


def burst_rows(results: list[dict[str, Any]]) -> list[str]:
    head = (
        "| N jobs | nodes | floor: all pods | operator: all pods | ratio | op: all Running | create loop floor / op "
        "| tail after last create floor / op | op CPU s/job | op peak RSS | req/job op run | floor run | operator's |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for result in results:
        for b in result.get("burst") or []:
            rows.append(burst_row(b, result["kwok_nodes"]))
    return rows


def profile_rows(result: dict[str, Any], top: int = 15) -> list[str]:
    rows = []
    for b in result.get("burst") or []:
        prof = b["operator"].get("profile")
        if not prof:
            continue
        rows += [f"profile, burst {b['jobs']}: {prof['samples']} samples", "", "| self | share | inclusive | share |"]
        rows.append("|---|---|---|---|")
        inclusive = [(f, v) for f, v in prof["inclusive"] if not any(r in f for r in ROOTS)]
        for (fs, s), (fi, i) in zip(prof["self"][:top], inclusive[:top], strict=False):
            rows.append(f"| {fs} | {s:.1%} | {fi} | {i:.1%} |")
    return rows


def main() -> int:
    results = [json.loads(Path(p).read_text()) for p in sys.argv[1:]]
    for result in results:
        if result.get("single"):
            print("\n".join(single_rows(result)), end="\n\n")
    print("\n".join(burst_rows([r for r in results if not r.get("profiled")])), end="\n\n")
    series = [b for r in results if not r.get("profiled") for b in r.get("burst") or [] if "timeline" in b["operator"]]
    if series:  # runs that recorded the load and the timeline (bench_operator.py --repeat)
        print("\n".join(series_table(series)), end="\n\n")
    for result in results:
        if result.get("profiled"):
            print("\n".join(profile_rows(result)), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
