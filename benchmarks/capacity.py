"""Sarathi-Serve's capacity experiment at H100 scale, in the simulator.

Capacity = the highest Poisson request rate whose P99 inter-token latency stays under an SLO while the
median scheduling delay stays under 2 s (Agrawal et al., OSDI 2024, §5.1). Monolithic prefill-first
(vLLM V0, <= 8,192 batched tokens) versus chunked prefill with budgets 512, 1024 and 2048, for Llama-3-8B
and Mistral-7B on one H100, under P99 ITL SLOs of 40 ms (strict enough that ITL, not queueing, decides
for large budgets), 100 ms and 500 ms (relaxed). Each row also says which limit binds just above the
capacity (``binding``: ``"itl"``, ``"delay"``, or ``"none"`` when the scan's top rate still passes), and
the capacity under every workload seed of ``--seeds`` (``capacity_qps_by_seed``; ``capacity_qps`` is seed
0's, ``capacity_qps_median`` the median over seeds): one seed is one sample of the arrivals and lengths,
and differences smaller than the spread across seeds are not differences. Workload: lognormal prompts
(median 2,048, sigma 0.8, 64-7,168 tokens) and outputs (median 256, sigma 0.8, 8-1,024): an assumed
long-prompt mix, not a recorded dataset. Cost model: ``CostModelExecutor``'s default operator form with
``CostFactors()``: the GEMM and small-op factors fitted on Vidur's published H100 operator profiles
(``longctx.sim.factors.FITTED_H100``), attention efficiency and the step and per-sequence overheads assumed;
the record keeps the factors (``factors``) and where each comes from (``factor_sources``).

    .venv/bin/python benchmarks/capacity.py [--num-requests 400] [--plot capacity.png] [--record]

``--record`` writes ``longctx/data/recorded/sim_capacity.json`` (read it with
``longctx.sim.scenarios.load_recorded()``). The paper reports 2.6x more capacity for Mistral-7B on one A100
under the strict SLO; compare the shape (who wins, by how much, under which SLO), not the numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import statistics
import time

from longctx.sim.cost_model import CostFactors
from longctx.sim.scenarios import (
    CAPACITY_OUTPUT,
    CAPACITY_PROMPT,
    MAX_MEDIAN_SCHEDULING_DELAY_S,
    capacity_table,
    default_schedulers,
    run_rate,
)

RECORD = pathlib.Path(__file__).resolve().parents[1] / "longctx" / "data" / "recorded" / "sim_capacity.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=400)
    ap.add_argument("--iterations", type=int, default=6, help="bisection steps after the doubling scan")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--plot", default=None, help="save a bar chart (png/pdf)")
    ap.add_argument("--record", action="store_true", help=f"write {RECORD.name} for the lessons")
    ap.add_argument("--slos", type=float, nargs="+", default=[0.04, 0.1, 0.5], help="P99 ITL SLOs (s)")
    ap.add_argument("--seeds", type=int, default=20, help="workload seeds (0 ... seeds-1): each row's "
                    "capacity_qps is seed 0's, with every seed's beside it")
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error(f"--seeds must be >= 1, got {args.seeds}")
    t0 = time.perf_counter()
    by_seed = [capacity_table(hardware=args.gpu, num_requests=args.num_requests, iterations=args.iterations,
                              slos_s=args.slos, seed=seed) for seed in range(args.seeds)]
    rows = by_seed[0]
    for i, r in enumerate(rows):
        r["binding"] = binding(r, args.num_requests)
        r["capacity_qps_by_seed"] = [table[i]["capacity_qps"] for table in by_seed]
        r["capacity_qps_median"] = statistics.median(r["capacity_qps_by_seed"])
    wall_s = time.perf_counter() - t0
    print(f"{'model':<12}{'SLO P99 ITL':>12}  {'scheduler':<14}{'capacity req/s':>15}{'x monolithic':>14}"
          f"  {'seeds (min-max)':>16}")
    for r in rows:
        base = next(x["capacity_qps"] for x in rows if x["model"] == r["model"]
                    and x["slo_p99_itl_s"] == r["slo_p99_itl_s"] and x["scheduler"] == "monolithic")
        r["gain_vs_monolithic"] = r["capacity_qps"] / base if base else None
        gain = "-" if r["gain_vs_monolithic"] is None else f"{r['gain_vs_monolithic']:.2f}x"
        seeds = r["capacity_qps_by_seed"]
        print(
            f"{r['model']:<12}{1e3 * r['slo_p99_itl_s']:>10.0f}ms  {r['scheduler']:<14}"
            f"{r['capacity_qps']:>15.2f}{gain:>14}  {min(seeds):>7.2f}-{max(seeds):<8.2f} binds: "
            f"{r['binding']}"
        )
    print(
        f"({wall_s:.0f} s; {args.num_requests} requests per load; Sarathi-Serve: 2.6x for Mistral-7B on A100)"
    )
    if args.plot:
        plot(rows, args.plot)
    if args.record:
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps({
            "what": "capacity (req/s) under a P99 ITL SLO and median scheduling delay <= 2 s, simulated; "
                    "binding: the limit that fails just above the capacity",
            "produced_by": "benchmarks/capacity.py",
            "date": datetime.date.today().isoformat(),
            "python": platform.python_version(),
            "num_requests": args.num_requests,
            "workload": {"prompt_tokens": vars(CAPACITY_PROMPT), "output_tokens": vars(CAPACITY_OUTPUT),
                         "arrival": "poisson", "seed": 0, "seeds": list(range(args.seeds))},
            "cost_form": "operator",
            "factors": vars(CostFactors()),
            "factor_sources": CostFactors().sources(),
            "rows": rows,
        }, indent=1) + "\n")
        print(f"recorded {RECORD}")


def binding(row: dict, num_requests: int) -> str:
    """Which limit fails just above the row's capacity: "itl", "delay", or "none" (top rate still passes)."""
    if row["capacity_qps"] >= 64.0:
        return "none"
    rate = max(row["capacity_qps"] * 1.1, 0.25)
    point = run_rate(default_schedulers()[row["scheduler"]], rate, model=row["model"], hardware=row["gpu"],
                     num_requests=num_requests)
    if point.p99_itl_s > row["slo_p99_itl_s"]:
        return "itl"
    return "delay" if point.p50_scheduling_delay_s > MAX_MEDIAN_SCHEDULING_DELAY_S else "none"


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    slos = sorted({r["slo_p99_itl_s"] for r in rows})
    scheds = list(dict.fromkeys(r["scheduler"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    width = 0.8 / len(scheds)
    for ax, model in zip(axes[0], models, strict=True):
        for j, s in enumerate(scheds):
            ys = [next(r["capacity_qps"] for r in rows if r["model"] == model and r["scheduler"] == s
                       and r["slo_p99_itl_s"] == slo) for slo in slos]
            ax.bar([i + j * width for i in range(len(slos))], ys, width, label=s)
        ax.set_xticks(
            [i + 0.4 - width / 2 for i in range(len(slos))], [f"P99 ITL < {1e3 * s:.0f} ms" for s in slos]
        )
        ax.set(title=f"{model} on {rows[0]['gpu']}", ylabel="capacity (req/s)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
