"""Measurements on a real GPU and their records (``longctx/data/gpu/<device key>.json``): ``suite`` and
``sections`` (with ``serving_sections``: the stall and the capstone through the engine) are ``make gpu-bench``
(the only code that measures); ``records`` is the record's schema and its
loader. Lessons read records (``longctx.lessons.gpu_cells``). Importing this package does not import torch."""
