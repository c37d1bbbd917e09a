"""The pruned configurations of ``benchmarks/kv_pruning.py``'s sweep and where its needles may sit.

``Config`` is one pruned configuration (a press, its ratio and options, question-aware or not; its ``label``
is the record's ``press_config``) and ``niah_configs`` every one the ``niah`` section runs. ``window_edges``
and ``check_placement``: the first token of every recent window the sweep's presses keep (StreamingLLM's 4-
and 32-sink windows, H2O's recent half), and a needle's distance to the nearest one, refused under
``EDGE_MARGIN`` tokens so that no needle straddles an edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EDGE_MARGIN = 8  # tokens between a needle and any window edge


@dataclass(frozen=True)
class Config:
    """One pruned configuration; ``label`` is its ``press_config`` in the record."""

    name: str  # the press_name in the record
    ratio: float = 0.0
    aware: bool = True
    options: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        if self.name == "none":
            return "none"
        extra = "".join(f" {k}={v}" for k, v in self.options.items())
        return f"{self.name} {self.ratio:g}{extra}" + ("" if self.aware else " agnostic")

    def press(self, seed: int, needle: range | None = None):
        from longctx.kv.intervention import ForcedPress
        from longctx.kv.press import make_press

        r = self.ratio
        if self.name == "none":
            return None
        if self.name == "h2o_mean":
            return make_press("h2o", r, normalization="mean")
        if self.name == "snapkv_force_needle":
            return ForcedPress(make_press("snapkv", r), needle)
        if self.name == "random_sink":  # random with token 0, the attention sink, kept in every head
            return ForcedPress(make_press("random", r, seed=seed), [0])
        if self.name in ("random_snapkv_needle", "random_sink_snapkv_needle", "knorm_snapkv_needle"):
            base = {
                "random_snapkv_needle": make_press("random", r, seed=seed),
                "knorm_snapkv_needle": make_press("knorm", r),
                "random_sink_snapkv_needle": ForcedPress(make_press("random", r, seed=seed), [0]),
            }[self.name]
            return ForcedPress(base, needle, donor=make_press("snapkv", r))
        return make_press(self.name, r, **({"seed": seed} if self.name == "random" else self.options))


def niah_configs(presses, ratios) -> list[Config]:
    out = [Config("none")]
    for r in ratios:
        for name in presses:
            out.append(Config(name, r))
            if name == "streaming_llm":
                out.append(Config(name, r, options={"n_sink": 32}))
            if name in ("snapkv", "h2o"):
                out.append(Config(name, r, aware=False))
            if name == "h2o":
                out.append(Config("h2o_mean", r))
            if name == "snapkv":
                out += [Config("snapkv_force_needle", r), Config("random_snapkv_needle", r),
                        Config("random_sink", r), Config("random_sink_snapkv_needle", r),
                        Config("knorm_snapkv_needle", r)]
    return out


def window_edges(T: int, ratios, streaming: bool = True) -> dict[str, int]:
    """``{what: first token position}`` of every recent window the sweep's presses keep of ``T`` tokens
    (``streaming=False``: H2O's only, for the question-agnostic prune of the context)."""
    from longctx.kv.press import H2OPress, StreamingLLMPress

    edges = {}
    for r in ratios:
        for sinks in (4, 32) if streaming else ():
            p = StreamingLLMPress(r, n_sink=sinks)
            edges[f"streaming_llm {r:g} n_sink={sinks}"] = T - (p.num_kept(T) - sinks)
        h = H2OPress(r)
        edges[f"h2o {r:g} recent half"] = T - round(h.recent_fraction * h.num_kept(T))
    return edges


def check_placement(prompt, ratios, margin: int = EDGE_MARGIN) -> int:
    """The needle's distance (tokens) to the nearest window edge; ``ValueError`` if under ``margin``."""
    a, b = prompt.needle_start, prompt.needle_start + prompt.needle_len
    worst, where = None, None
    for T, streaming in ((prompt.length, True), (prompt.question_start, False)):  # aware, agnostic
        for what, e in window_edges(T, ratios, streaming).items():
            d = a - e if e <= a else (e - b if e >= b else -1)
            if worst is None or d < worst:
                worst, where = d, f"{what} (of {T} tokens) at {e}"
    if worst < margin:
        raise ValueError(f"the needle at tokens {a}..{b - 1} is {worst} tokens from the edge of {where}: "
                         f"choose another depth (need >= {margin})")
    return worst
