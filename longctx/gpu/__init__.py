"""Measurements on a real GPU and the records they leave (``longctx/data/gpu/<device key>.json``).

- ``suite`` / ``sections``: ``python -m longctx gpu-bench`` (``make gpu-bench``): ``run_suite`` times each
  point with ``time_fn`` (CUDA events, warm-up, median of repeats) and returns one record with provenance;
  ``BenchConfig.toy()`` runs it on the CPU in seconds.
- ``records``: the record's schema (``GpuRecord``, a pydantic model), ``load_record``, ``save_record``,
  ``describe``, ``device_key``.

Only ``make gpu-bench`` measures. The lessons read records (``longctx.lessons.gpu_cells``); the simulator is
calibrated from one by ``benchmarks/gpu_calibration.py``. Importing this package does not import torch.
"""
