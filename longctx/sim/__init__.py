"""The serving simulator: the engine with a cost-model executor and a virtual clock (no torch).

    from longctx.sim import make_workload, simulate, LogNormal
    from longctx.engine import ChunkedPrefillScheduler
    wl = make_workload(1000, rate_qps=5, prompt_tokens=LogNormal(2048, 0.6, high=8000), output_tokens=256)
    res = simulate(wl, ChunkedPrefillScheduler(token_budget=1024), model="llama-3-8b", hardware="h100")
    res.metrics.itl.p(99), res.to_dict()["ttft_s"]["p50"]

- ``cost_model``: ``CostModelExecutor`` (per-operator roofline by default, or the whole-batch one),
  ``CostFactors`` (defaults fitted on published H100 profiles where measured, assumed elsewhere).
- ``operators``: the linear part operator by operator (QKV, O, gate+up, down, small per-token ops).
- ``profiles``: Vidur's published H100 operator timings, as shipped (``load_profiles``).
- ``gemm_profile``: ``GemmProfile``, a model's GEMMs, small ops and fresh-chunk attention timed on this
machine
  (``measure_gemm_profile``); ``CostModelExecutor(..., gemm_profile=)`` prices those from it.
- ``calibration``: ``fit_profiles`` (H100 factors from those profiles, with their error per model and
  token range, ``leave_one_model_out``) and ``calibrate`` (the step factors from measured steps); the search
  of the form's best factors over a grid lives in ``benchmarks/sim_profiles.py``, its one user.
- ``recording``: ``RecordingExecutor`` keeps a real engine's steps as ``MeasuredStep``\\ s.
- ``workload``: ``make_workload`` with Poisson / gamma arrivals; ``Fixed``, ``Uniform``, ``LogNormal``,
``Trace``. - ``run``: ``simulate`` -> ``SimResult``; ``build_sim_engine``; ``kv_pool_blocks``.
- ``scenarios``: ``capacity`` (highest rate under an ITL SLO), rate sweeps.
"""

from longctx.sim.calibration import Calibration, calibrate
from longctx.sim.cost_model import COST_FORMS, CostFactors, CostModelExecutor
from longctx.sim.recording import MeasuredStep, RecordingExecutor, ReplayExecutor, ScaledExecutor
from longctx.sim.run import SimResult, build_sim_engine, kv_pool_blocks, simulate
from longctx.sim.workload import Fixed, LogNormal, Request, Trace, Uniform, arrival_times, make_workload

__all__ = [
    "COST_FORMS", "Calibration", "CostFactors", "CostModelExecutor", "Fixed", "LogNormal", "MeasuredStep",
    "RecordingExecutor", "ReplayExecutor", "ScaledExecutor", "Request", "SimResult", "Trace", "Uniform",
    "arrival_times", "build_sim_engine", "calibrate", "kv_pool_blocks", "make_workload", "simulate",
]
