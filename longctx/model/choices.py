"""The names the real model's placement accepts, without torch: the command line lists them as choices
(``--dtype``, ``--attention-backend``) while staying cheap to start (``python -m longctx calc`` and every
argument error answer without loading torch).

``longctx.model.device`` maps ``DTYPE_NAMES`` to torch dtypes; ``longctx.model.attention`` chooses among
``BACKEND_NAMES``.
"""

BACKEND_NAMES = ("auto", "reference", "fused")
DTYPE_NAMES = ("fp32", "bf16", "fp16")
DTYPE_CHOICES = ("auto", *DTYPE_NAMES)
