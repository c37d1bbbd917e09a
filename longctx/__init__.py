"""longctx: the helper package of the Long-Context Serving Lab.

Napkin-math calculators (`specs`, `memory`, `flops`, `roofline`) import nothing heavier than numpy.
The real model (`model/`), the paged KV cache (`kv/`), the engine (`engine/`) and the simulator
(`sim/`) are imported on demand, never at package import time.
"""

__version__ = "0.1.0"
