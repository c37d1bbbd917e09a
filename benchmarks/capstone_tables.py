"""The tables ``benchmarks/capstone.py`` prints after each section (from the section's record data)."""

from __future__ import annotations

DTYPES = ("fp32", "bf16", "fp8", "int8", "int4")  # the KV formats the capstone compares, in table order


def table(section: str, data: dict) -> str:
    """One section's rows as a text table (the load test with its verdicts, NIAH by length and KV dtype, or
    every scalar column)."""
    rows = data["rows"]
    if section == "sim":
        lines = [
            f"{'model':<11} {'kv':>4} {'prefix':>6} {'plan':>5} {'peak run':>8} {'all 64 s':>8} "
            f"{'blocks peak/plan/pool':>22} {'preempt':>7} {'TTFT p50/p99 s':>14} {'ITL p50/p99 ms':>14}  "
            "verdict"
        ]
        for r in rows:
            lines.append(f"{r['model']:<11} {r['kv_dtype']:>4} {'2K' if r['prefix_caching'] else '-':>6} "
                         f"{r['plan_max_users']:>5} {r['peak_running']:>8} {r['seconds_all_running']:>8.1f} "
                         f"{r['peak_used_blocks']:>7}/{r['planned_blocks']:>6}/{r['pool_blocks']:>6} "
                         f"{r['preemptions']:>7} {r['ttft_s']['p50']:>6.1f}/{r['ttft_s']['p99']:<6.1f} "
                         f"{r['itl_ms']['p50']:>6.1f}/{r['itl_ms']['p99']:<6.0f}  "
                         f"{'PASS' if r['passes'] else 'FAIL: ' + '; '.join(r['failures'])}")
        lines.append("same-step sharing (llama-3-8b fp8, 2K prefix cached):")
        for r in data.get("same_step", []):
            lines.append(
                f"  {r['traffic']:<15} sharing {'on ' if r['same_step_sharing'] else 'off'}: prefilled "
                f"{r['prefill_tokens']:>7,} tokens, {r['prefix_hit_tokens']:>7,} from the cache, peak "
                f"{r['peak_used_blocks']:>6} blocks, TTFT p50 {r['ttft_s']['p50']:.3f} s p99 "
                f"{r['ttft_s']['p99']:.3f} s"
            )
        return "\n".join(lines)
    if section == "niah":
        from collections import defaultdict

        acc = defaultdict(list)
        for r in rows:
            acc[(r["length"], r["kv_dtype"])].append(r)
        lines = [f"{'tokens':>7} {'kv':>5} {'correct':>8} {'mean logp':>10}"]
        for (n, kv), rs in sorted(acc.items(), key=lambda x: (x[0][0], DTYPES.index(x[0][1]))):
            lines.append(f"{n:>7} {kv:>5} {sum(r['correct'] for r in rs):>4}/{len(rs):<3} "
                         f"{sum(r['answer_logprob'] for r in rs) / len(rs):>10.3f}")
        return "\n".join(lines)
    keys = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], (list, dict))))
    lines = ["  ".join(keys)]
    for r in rows:
        lines.append(
            "  ".join(f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k, "-")) for k in keys)
        )
    return "\n".join(lines)
