"""Measurements on a real GPU and their records (``longctx/data/gpu/<device key>.json``): ``suite``, its
``preflight`` (what the card can run, every section sized to its free memory) and the sections
(``sections``; ``decode_sections``: decode steps with and without CUDA graphs, and their profile;
``serving_sections``: prefill, the stall and the capstone through the engine) are ``make gpu-bench`` (the only
code that measures); ``records`` is the record's schema and its loader. Lessons read records
(``longctx.lessons.gpu_cells``). Importing this package does not import torch."""
