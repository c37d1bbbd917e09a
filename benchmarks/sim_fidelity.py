"""Simulator fidelity: calibrate on one workload run by the real engine on this CPU, predict another.

1. Measure this CPU (numpy GEMM peak, copy bandwidth) as a ``HardwareSpec``, and its **GEMM profile**
   (``longctx.sim.gemm_profile``: the engine's own GEMMs and small per-token ops timed at 1 ... 640 rows,
   Vidur's method on a CPU), once before each repeat; the median of those profiles is the one used (a
   single profile carries the machine's speed of that minute). The record's cost model prices those from the
   profile; the attention and the
   step and per-sequence overheads stay modelled and fitted. The roofline-GEMM model runs beside it on the
   same real runs, for comparison (below: why a profile).
2. Workload A (calibration): the real engine (SmolLM2-135M, fp32, ``TorchExecutor``) serves 10 requests
   sent at once (the burst: prompt chunks fresh and after a prefix, decode batches of up to 10), then a
   staircase of 5 short-prompt requests 1 s apart with 48 outputs each from 14 s (decode-only batches of 1
   to 5 sequences, 14-19 steps of each when simulated, 8-24 in the record's real runs), chunked prefill with a
   256-token budget, ``--repeats`` times, each run followed by a run of B (so a slow drift of a shared
   machine's speed reaches calibration and test alike); every step's composition and time is recorded and
   ``calibrate`` fits the cost model's factors on all of A's steps. Why the staircase: until the third
   measurement A was the burst
   alone, 16 decode-only steps per run over all batch sizes (simulated: one each of 1 and 2 sequences), while
   B ran 104 single-sequence decodes per run (627 in six); the second measurement priced those +23 % (the step
   and per-sequence overheads' split, which A pinned poorly). The staircase was added for that coverage alone
   (a rule: every decode batch size B runs most,
   1-5, held for 10 steps or more, checked in the simulator), before any real run of it; B is unchanged.
3. Workload B (prediction, different lengths, arrivals and budget): 48 requests, Poisson arrivals at 0.5
   req/s, lognormal prompts, chunked prefill with a 512-token budget. Simulated once (calibrated cost model,
   virtual clock, same requests) against the ``--repeats`` real runs (wall clock; each run waits for a quiet
   CPU); the errors are of the median measured value, with each run's error beside it.
4. The calibration's own spread: each run of A is left out in turn and the refit predicts B again (how far
   the prediction moves with the calibration's noise).
5. Conditioning (an intervention on the simulator alone): B is simulated again with every step 3 % slower
   and 3 % faster. A metric that moves much more than 3 % is decided by schedule coincidences (which
   arrival lands in which step), not by the cost model, and no 5 % claim about it can be judged.
6. The machine's drift, paired out: a shared VM's speed wanders between runs (all four metrics of one run
   come out slow together). Each run of A measures it: the median of its steps' measured / priced time under
   the pooled calibration. Each run of B is compared with the prediction at the speed of the run of A just
   before it (``ScaledExecutor``); the per-run errors give a mean and a 95 % t-interval. The rule, fixed
   before this step's first run: a targeted metric is **shown within 5 %** when that interval lies inside
   +-5 % and the machine was steady (7); "mean within 5 %, interval wider" is not shown. Both with and
   without the pairing are printed.
7. The instrument's steadiness: a speed probe (``longctx.sim.hardware.probe_gemm_s``, one fixed GEMM for a
   second) before each A and before and after each B. If its largest reading exceeds its smallest by more
   than 10 %, the machine's own speed moved by more than the target and the verdict is "cannot be judged".
8. Replay (an intervention: the cost model's error forced off). Each run of B is simulated again with each
step
   given the measured time of the same step of that run (``longctx.sim.ReplayExecutor``), until the simulated
   batch first differs from the real one (the schedules *part*; the calibrated model prices the steps after).
   Where a replay never parts, what is left of a metric's error is the simulator's schedule and bookkeeping;
   once more with every step longer by the engine's own time between steps (its scheduling and bookkeeping,
   ``run_real`` measures it on A; the virtual clock does not count it).

    .venv/bin/python benchmarks/sim_fidelity.py [--repeats 6] [--record] [--force] [--save-runs FILE]
    .venv/bin/python benchmarks/sim_fidelity.py --from-runs FILE [--record]   # re-analyse saved runs

The record keeps its raw runs (every step of A and B: entries and seconds) in ``sim_fidelity_runs.json``.

Why B is 48 requests at 0.5 req/s: the earlier B (12 requests at 1 req/s) was ill-conditioned: with steps 3 %
slower its simulated P99 ITL rose 21 % (the P99 of ~250 gaps is the third-largest: whether two prompts
share a step), and identical real runs spread 1.03-1.40 s. At 48 requests and 0.5 req/s P99 ITL moves by
about as much as the steps do in every calibration, median TTFT by up to 2.7 times as much (-8.0 % for steps
3 % faster in the first measurement: a faster step lets queued arrivals start sooner), median ITL sometimes by
far more (-16.7 % in the record of 2026-12-03: it sat on the decode stair, see "Why a profile"). Step 5 prints
each, so a 5 % error can be told from schedule luck. The workload was chosen on the simulator's conditioning
alone, before any real run.

Target: median TTFT and P99 ITL within 5 % (issue 26). **Not shown**: on the machines this ran on, the
machine's own speed moves by more than the target while it is measured.

The record (2026-12-04, the third of three six-pair measurements that day, the first with A's staircase,
decided beforehand to be the record whatever it showed; 2-core AMD EPYC VM, quiet by load average) against the
median of B's six runs, and step 6's paired mean with its 95 % t-interval:

    median TTFT (profiled GEMMs)  -10.3 %   paired -2.9 % [-16.5, +10.7]
    P99 ITL (profiled GEMMs)      -14.2 %   paired -5.5 % [-20.2, +9.2]
    median ITL (profiled GEMMs)    -9.1 %   paired -7.6 % [-14.8, -0.4]
    median E2E (profiled GEMMs)   -10.5 %   paired -4.4 % [-19.8, +11.0]
    median TTFT (roofline GEMMs)   -7.1 %   paired -0.1 % [-14.1, +13.9]
    P99 ITL (roofline GEMMs)       -9.6 %   paired -6.2 % [-14.5, +2.1]
    median ITL (roofline GEMMs)   -20.7 %   paired -20.8 % [-32.3, -9.2]
    median E2E (roofline GEMMs)    -9.9 %   paired -8.6 % [-25.5, +8.4]

The verdict by step 7's rule is "cannot be judged": the speed probe spread 11 % over the measurement
(9.69-10.75 ms), and the six GEMM profiles taken before the six repeats differed by 27-37 % per GEMM group
(median over row counts of max / min - 1; small ops 136 %, fresh-chunk attention 72 %); A's six runs ran at
0.93-1.20 times the pooled calibration's step times. Run by run, the errors of the same simulation against six
real runs of the identical B spread -16.3 ... +6.9 % (median TTFT) and -21.9 ... -5.1 % (P99 ITL, profiled).
Outside the rule, the served metrics missed the target too: the profiled model priced B's prompt steps of 257+
tokens 7-8 % fast (measured / priced 1.07-1.08) while its decodes were right (1.01), and a faster step lets
queued arrivals start sooner (median TTFT moved -4.1 % for steps 3 % faster). Step 6's pairing with A's speed
narrowed the means but widened the intervals.

The two earlier six-pair measurements of the day, with A the burst alone: the first (commit 68e6a9a, probe 15
%, profiles 20-30 %): profiled GEMMs median TTFT -7.9 %, P99 ITL -8.2 % (run by run -26.5 ... +2.6 % and -15.9
... +0.7 %), roofline -5.4 %, -8.4 %; the second (the record at commit 9da02c2, probe 20 %, profiles 27-38 %):
profiled +5.1 %, +14.1 % (run by run -3.8 ... +32.3 % and +4.7 ... +21.7 %), roofline +5.0 %, +0.9 %. So on
the served metrics neither model is shown closer: the three measurements disagree by more than the two models
do. A fixed GEMM timed in 5-second windows on that VM took 10.6-13.9 ms within two minutes (31 %).

Earlier measurements, all with the same script's workloads:

- 2026-12-03, Intel Xeon VM, roofline GEMMs, six three-run measurements: median TTFT +0.5, -1.4, -8.5, -0.0,
  -6.5, -2.9 % (mean -3.1 %, 95 % t-interval [-7.0, +0.7]); P99 ITL -2.3, -3.2, -2.9, +0.8, -2.9, -1.8 %
  ([-3.6, -0.5]). Identical real runs of B spread median TTFT by a coefficient of variation of 5.2 %.
- 2026-12-04, AMD VM, six-run measurements, both models on the same real runs: with a GEMM profile of the
GEMMs
  alone, median TTFT -5.9 % (roofline -10.3 %), P99 ITL +0.1 % (-4.9 %); with the small ops profiled too but
  one profile taken at the start, +20.7 % (-0.9 %) and +8.4 % (-1.5 %). Re-priced on those same runs with a
  fresh-chunk attention profile (``causal_attention``, taken later): +4.4 % and +3.1 %. That diagnosis came
  from the printed steps by new tokens: the profiled model priced B's 401+-token steps 13 % too slow (measured
  / priced 0.883), because its one
  attention efficiency was fitted on A's chunks, nearly all after a cached prefix (masked attention in query
  tiles), while B's 512-token chunks are mostly fresh prompts (one fused causal call).

Why a profile. A roofline prices a GEMM by its FLOPs and bytes; a CPU BLAS picks its kernel by the row count,
differently on each CPU. On the Intel VM ``torch.nn.functional.linear`` through SmolLM2's 576 x 3,072 gate+up
took 319, 325, 322 us for 1-3 rows, 582-594 for 4-6, 859-863 for 7-9 and 766 us at 16 rows (the weights
streamed once per 3 rows below 16); on the AMD VM the LM head took 9.9, 22.6, 36.7, 18.1 ms for 1-4 rows (1-3
rows as matrix-vector products, 4 as one blocked kernel). Decode-only steps of 1-5 sequences on the AMD VM
took 66.1, 105.7, 136.8, 105.8, 122.2 ms in the first measurement, 71.9, 113.9, 145.4, 117.9, 132.6 ms in the
second and 66.0, 105.7, 142.2, 115.9, 124.7 ms in the record. A step time linear in the batch cannot follow
that: the roofline model priced them +32, -11, -26, +2, -6 %, +41, -4, -18, +8, +2 % and +13, -19, -32, -7, -5
%; the profiled model +3, +0, -3, -2, -3 %, +23, +6, +3, +2, +1 % and +4, +3, -5, -3, -6 % (the second's +23
%, a single sequence, was the step overheads' split, which the burst alone pinned poorly: A's staircase took
it to +4 %). Over all of B's real steps the median |error| was 10.3, 11.6 and 10.0 % profiled against 17.3,
17.4 and 15.3 % roofline. The profile measures
the engine's own ops as it runs them; what remains fitted (step and per-sequence overheads, the attention of
decodes and of chunks after a prefix) is what A's steps can pin.

What the replay shows (step 8; added after the first two measurements and run on their saved runs too, which
are not shipped; the record's analysis was redone from its shipped runs, measurement and provenance
unchanged). The engine spends a median 0.120 ms of its own per step (``HOST_GAP_DEFINITION``; one run of A,
115 steps, P90 0.192 ms), about 0.1 % of a step, which the virtual clock does not count (the record's own
0.077 ms was measured as the next start minus this end, which left out the engine's work inside a step).
Replayed with the measured
step times alone, 2 of 6 runs never part in each of the three measurements, and in those six runs every metric
is within 0.9 % of the real run (median TTFT -0.9 ... -0.6 %, P99 ITL -0.01 %). With each step 0.120 ms
longer, 5 of 6 never part in each measurement, and in those fifteen runs every metric is within 0.16 % (the
record: 0.10 %). So the schedule, the metrics' bookkeeping and the virtual clock are the engine's to a fifth
of a per cent, given its step times, and a tenth of a millisecond per step decides which step an arrival
joins: the served metrics' errors above are the steps' prices (the cost model and the machine's speed), not
the simulated schedule. A run that parts is priced by the model after that step: the record's one, -4.1 %
median TTFT after parting at step 49 of 342; in the second measurement +8.8 % after step 44 of 394 (profiled;
roofline +17.7 %).

So: per step the profiled model is the better one in all three measurements (it follows the AMD VM's stair;
the Intel VM's was never profiled), and the simulated schedule is the engine's (step 8). Whether the served
metrics are within 5 % needs a machine steadier than 10 % over a quarter of an hour (the rule), which no AMD
measurement had (the Intel VM was not probed). ``--repeats``
more pairs narrow the intervals only as the square root.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import pickle

# One core for everything (torch and numpy's BLAS): oversubscribed threads make step times erratic.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from sim_fidelity_analysis import (  # noqa: E402  (the analysis: steps 2-8)
    A_BUDGET,
    B_BUDGET,
    B_RATE,
    B_REQUESTS,
    METRICS,
    evaluate,
)
from sim_fidelity_measure import (  # noqa: E402  (step 1 and the runs: measuring)
    HOST_GAP_DEFINITION,
    HOST_GAP_S,
    STAIR_GAP_S,
    STAIR_REQUESTS,
    STAIR_START_S,
    cost_models,
    load_saved,
    measure,
    steps_from_json,
    steps_to_json,
    workloads,
)
from sim_fidelity_record import (  # noqa: E402  (the record: its inputs, files and provenance)
    RECORD,
    RUNS,
    STEADY_SPREAD,
    print_inputs,
    record_files,
    record_provenance,
)

from longctx.provenance import load_gate  # noqa: E402
from longctx.sim.gemm_profile import GemmProfile  # noqa: E402

__all__ = ["A_BUDGET", "B_BUDGET", "B_RATE", "B_REQUESTS", "METRICS", "RECORD", "RUNS", "STAIR_GAP_S",
           "STAIR_REQUESTS", "STAIR_START_S", "STEADY_SPREAD", "cost_models", "load_saved", "main", "measure",
           # the script's names, its parts' included (tests read them)
           "steps_from_json", "steps_to_json", "workloads"]


def _args(argv):
    """The command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help=f"write {RECORD.name}")
    ap.add_argument(
        "--force", action="store_true", help="record despite the load (marks the record unusable)"
    )
    ap.add_argument("--repeats", type=int, default=6, help="real runs of A and of B, alternating")
    ap.add_argument(
        "--save-runs", type=pathlib.Path, metavar="FILE", help="also pickle the measured runs to FILE"
    )
    ap.add_argument(
        "--from-runs",
        type=pathlib.Path,
        metavar="FILE",
        help="measure nothing: re-analyse saved runs, a pickle --save-runs wrote (only a file you made) "
        f"or the record's {RUNS.name}; with --record, rewrite the record's analysis, keeping its "
        "measurement's provenance",
    )
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def main(argv=None) -> None:
    args = _args(argv)
    threads = int(os.environ["OMP_NUM_THREADS"])
    if args.from_runs:
        saved = load_saved(args.from_runs)
        gate_load = os.getloadavg()[0]
    else:
        gate_load = load_gate(threads, args.force) if args.record else os.getloadavg()[0]
        saved = measure(threads, args.repeats, args.force)
    hw, profile, profiles = saved["hardware"], saved["profile"], saved["profiles"]
    runs_a, real_runs, probes = saved["runs_a"], saved["real_runs"], saved["probes"]
    _, wl_b = workloads()
    profile_spread = GemmProfile.spread_of(profiles) if profiles else saved["profile_spread"]
    profiled, roofline = cost_models(hw, profile)
    spread, steady = print_inputs(profile, profiles, profile_spread, len(runs_a), probes)
    if args.save_runs:  # everything evaluate() reads, for a re-analysis without re-measuring
        args.save_runs.write_bytes(pickle.dumps(saved))
    measured_gap = saved.get("host_gap_definition") == HOST_GAP_DEFINITION
    # saved without it (or as defined before): HOST_GAP_S
    gap = saved["host_gap_s"] if measured_gap else HOST_GAP_S
    result = evaluate(
        "GEMMs from this machine's profile (the record's model)", profiled, runs_a, real_runs, wl_b, steady,
        gap,
    )
    without = evaluate(
        "GEMMs on their rooflines (for comparison)", roofline, runs_a, real_runs, wl_b, steady, gap
    )
    if not args.record:
        return
    if saved.get("workload_a") is None or "threads" not in saved:
        raise SystemExit(
            f"{args.from_runs} was saved without its workload A and thread count: it cannot be recorded"
        )
    analysis, runs_file = record_files(saved, profile, profile_spread, spread, steady, gap, measured_gap,
                                       result, without)
    provenance = record_provenance(args, analysis, probes, gate_load)
    RECORD.write_text(json.dumps({**provenance, **analysis}, indent=1) + "\n")
    header = {k: provenance[k] for k in ("commit", "commit_note", "date") if k in provenance}
    RUNS.write_text(json.dumps({**runs_file, **header}, separators=(",", ":")) + "\n")
    print(f"recorded {RECORD} and {RUNS.name}")


if __name__ == "__main__":
    main()
