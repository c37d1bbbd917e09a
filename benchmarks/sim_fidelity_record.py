"""The record of ``benchmarks/sim_fidelity.py`` beyond the analysis (``sim_fidelity_analysis``): the
measurement's inputs as printed and recorded (the GEMM profile and the spread of the profiles, the speed
probes and the steadiness rule of step 7, ``STEADY_SPREAD``), the record's analysis and its runs file
(``RECORD``, ``RUNS``: every step of A and B, entries and seconds), and the record's provenance: a new
measurement's, or (``--from-runs``) the recorded measurement's with when and by what its analysis was redone.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import platform

from sim_fidelity_analysis import B_BUDGET, B_RATE, B_REQUESTS
from sim_fidelity_measure import HOST_GAP_DEFINITION, HOST_GAP_MEASURED, RECORD_FILE, RUNS_FILE, steps_to_json

from longctx.provenance import git_commit, git_dirty, machine
from longctx.sim.gemm_profile import GROUPS as GEMM_GROUPS

RECORD = pathlib.Path(__file__).resolve().parents[1] / "longctx" / "data" / "recorded" / RECORD_FILE
RUNS = RECORD.with_name(RUNS_FILE)  # the record's raw measured runs (compact)
STEADY_SPREAD = 0.10  # the speed probe's largest / smallest - 1 over a measurement (module docstring)


def record_provenance(args, analysis: dict, probes, gate_load: float) -> dict:
    """The record's provenance: a new measurement's, or (``--from-runs``) the recorded measurement's, with
    when and by what its analysis was redone."""
    import torch

    if args.from_runs:  # the measurement's provenance stays; the analysis says when and by what it was redone
        old = json.loads(RECORD.read_text())
        if old.get("speed_probe_s") != probes:
            raise SystemExit(
                f"{args.from_runs} does not hold the measurement in {RECORD.name} (its speed probes "
                "differ): record a new measurement instead"
            )
        provenance = {k: v for k, v in old.items() if k not in analysis and k != "reanalysed"}
        provenance["reanalysed"] = {
            "date": datetime.date.today().isoformat(), "commit": git_commit(), "commit_dirty": git_dirty(),
            "from": f"the measurement's saved runs ({args.from_runs.name})",
        }
    else:
        provenance = {
            "what": "simulator fidelity: calibrate on workload A (real engine, this CPU), predict workload B",
            "produced_by": "benchmarks/sim_fidelity.py", "date": datetime.date.today().isoformat(),
            "python": platform.python_version(), "torch": torch.__version__, "commit": git_commit(),
            "commit_dirty": git_dirty(), "machine": machine(), "load_average_1min_start": gate_load,
            "usable": not args.force}
    return provenance


def print_inputs(profile, profiles, profile_spread, num_runs_a: int, probes) -> tuple[float, bool]:
    """Print the GEMM profile, its spread and the speed probes; returns the probes' spread and steadiness."""
    print(
        "GEMM profile (ms, all layers; the LM head once), rows: "
        + "; ".join(
            f"{n}: " + "/".join(f"{1e3 * profile.seconds[g][i]:.1f}" for g in GEMM_GROUPS)
            for i, n in enumerate(profile.rows)
            if n <= 16 or n in (64, 256, 512)
        )
        + f"  ({'/'.join(GEMM_GROUPS)})",
        flush=True,
    )
    print(
        "  spread of the "
        + str(len(profiles) if profiles else num_runs_a)
        + " profiles (median over rows of max / min - 1): "
        + ", ".join(f"{g} {100 * v:.0f} %" for g, v in profile_spread.items())
    )
    spread = max(probes) / min(probes) - 1
    steady = spread <= STEADY_SPREAD
    print(
        f"speed probe (one fixed GEMM, ms) before each A, before and after each B: "
        f"{' '.join(f'{1e3 * p:.2f}' for p in probes)}; spread {100 * spread:.0f} %: "
        + ("steady" if steady else f"UNSTEADY (> {100 * STEADY_SPREAD:.0f} %): no 5 % claim can be judged"),
        flush=True,
    )
    return spread, steady


def record_files(saved, profile, profile_spread, spread, steady, gap, measured_gap, result, without):
    """The record's analysis and its runs file (``RECORD``, ``RUNS``)."""
    hw, probes, runs_a, real_runs = saved["hardware"], saved["probes"], saved["runs_a"], saved["real_runs"]
    analysis = {
        "cpu": {
            "peak_flops_per_s": hw.peak_flops_per_s, "bandwidth_bytes_per_s": hw.memory_bandwidth_bytes_per_s,
            "torch_threads": saved["threads"],
        },
        "workload_a": saved["workload_a"],
        "workload_b": {"requests": B_REQUESTS, "rate_per_s": B_RATE, "budget": B_BUDGET},
        "gemm_profile": profile.to_dict(),
        "gemm_profile_spread": profile_spread,
        "speed_probe_s": probes,
        "speed_probe_spread": spread,
        "steady": steady,
        "host_gap_s": gap,
        "host_gap_definition": HOST_GAP_DEFINITION,
        "host_gap_source": "measured on A's runs" if measured_gap else f"HOST_GAP_S ({HOST_GAP_MEASURED})",
        **(
            {"host_gap_earlier_definition_s": saved["host_gap_earlier_definition_s"]}
            if "host_gap_earlier_definition_s" in saved
            else {}
        ),
        **result,
        "roofline_gemms": without,
        "measured_runs": RUNS.name,
    }
    runs_file = {
        "what": f"the measured runs behind {RECORD.name}: "
        "A's and B's steps ([seconds, [[new, cached], ...]])",
        "a": [steps_to_json(run) for run in runs_a],
        "b": [
            {
                "repeat": rep, "load_1min_start": load, "wall_s": wall, "measured_s": measured,
                "steps": steps_to_json(steps),
            }
            for rep, load, wall, measured, steps in real_runs
        ],
    }
    return analysis, runs_file
