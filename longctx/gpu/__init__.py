"""Measurements on a real GPU and their records (``longctx/data/gpu/<device key>.json``): ``suite`` and
``sections`` are ``make gpu-bench`` (the only code that measures); ``records`` is the record's schema and its
loader. Lessons read records (``longctx.lessons.gpu_cells``). Importing this package does not import torch."""
