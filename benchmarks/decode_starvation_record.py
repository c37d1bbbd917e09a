"""The record of ``benchmarks/decode_starvation.py``: every round of runs, per scheduler its median run (by
the long prompt's TTFT) with its step timeline, a summary per scheduler over the rounds, the recommended
budget and the provenance.

A round runs every scheduler once. ``summarize`` gives, per scheduler and metric, the median over the rounds,
their range and (from two rounds on) the mean with its 95 % Student-t interval (``longctx.evals.stats``); the
recommended budget is the largest whose median worst gap stays within ``--max-ratio`` of the decode-only ITL.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
from pathlib import Path

from longctx.evals.stats import mean_interval
from longctx.provenance import cpu_name, git_commit, git_dirty, machine

METRICS = ("itl_median_s", "itl_p99_s", "itl_max_s", "itl_decode_only_median_s",
           "max_over_decode_only_median", "ttft_long_s", "largest_prefill_s_per_token")


def scheduler_name(row: dict) -> str:
    return "monolithic" if row["token_budget"] is None else f"chunked {row['token_budget']}"


def summarize(rounds: list[list[dict]]) -> list[dict]:
    """Per scheduler (in the rounds' order): n and, per metric, median, min, max and the mean's interval."""
    out = []
    for runs in zip(*rounds, strict=True):
        entry = {"scheduler": runs[0]["scheduler"], "token_budget": runs[0]["token_budget"], "n": len(runs)}
        for metric in METRICS:
            values = [r[metric] for r in runs]
            stats = {"median": statistics.median(values), "min": min(values), "max": max(values)}
            if len(values) >= 2:
                mean, low, high = mean_interval(values)
                stats.update(mean=mean, mean_low=low, mean_high=high)
            entry[metric] = stats
        out.append(entry)
    return out


def median_runs(rounds: list[list[dict]]) -> list[dict]:
    """Per scheduler, the run whose long-prompt TTFT is the median of the rounds' (the lower one of the middle
    two for an even count), with its ``round``: a real run, timeline included, to plot as the typical one."""
    out = []
    for runs in zip(*rounds, strict=True):
        i = sorted(range(len(runs)), key=lambda k: runs[k]["ttft_long_s"])[(len(runs) - 1) // 2]
        out.append(dict(runs[i], round=i))
    return out


def recommended_budget(summary: list[dict], max_ratio: float) -> int | None:
    ok = [s["token_budget"] for s in summary
          if s["token_budget"] and s["max_over_decode_only_median"]["median"] <= max_ratio]
    return max(ok) if ok else None


def write_record(args, rounds: list[list[dict]], summary: list[dict], best: int | None, loads: list[float],
                 torch_version: str) -> None:
    """The record (``--json``); ``summary`` and ``best`` as ``summarize`` and ``recommended_budget`` say."""
    out = {
        "benchmark": "decode_starvation",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "recommended_token_budget": best,
        "summary": summary,
        "rows": median_runs(rounds),
        "rounds": [[{k: v for k, v in r.items() if k != "timeline"} for r in runs] for runs in rounds],
        "provenance": {
            "date": datetime.date.today().isoformat(), "torch": torch_version,
            "python": platform.python_version(), "machine": machine(), "processor": cpu_name(),
            "cores": os.cpu_count(), "threads": args.threads, "device": "cpu", "n": len(rounds),
            "commit": git_commit(), "commit_dirty": git_dirty(), "load_average_1min_per_round": loads,
            "usable": not args.force,
        },
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")
