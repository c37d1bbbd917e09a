"""Published H100 operator timings (Vidur's profiles), as the table the calibration fits.

The Vidur project (microsoft/vidur, MIT licence) timed every operator of one transformer layer on an
NVIDIA H100 for 1 ... 4,096 tokens at tensor parallelism 1, 2, 4 and 8. ``longctx/data/profiles/
vidur_h100_linear.json`` keeps what the fit needs (attribution and the MIT licence text inside): for each
model its layer shapes and layer count, and for each (TP, token count) the median time of each operator
in milliseconds (the median over Vidur's rows for that point). ``table_from_vidur_csvs`` rebuilds it
from Vidur's ``mlp.csv`` files.

Operators (Vidur's names): ``attn_pre_proj`` (fused QKV), ``attn_post_proj`` (O), ``mlp_up_proj`` (fused
gate+up, or up alone without a gated MLP), ``mlp_down_proj``, and the small per-token ops
``input_layernorm``, ``post_attention_layernorm`` (absent for phi-2's parallel block), ``attn_rope``,
``mlp_act``, ``add`` (a residual add) and ``emb`` (the embedding lookup). Attention kernels and the LM head
are not in these profiles.

**Measured linear time** of a step of ``n`` tokens (what ``CostModelExecutor.linear_time_s`` models)::

    num_layers * (sum of the layer's profiled ops, with add counted twice: two residual adds) + emb

Llama-2-7B and Llama-3-8B, the course's models, are deliberately not in the table: they test the fit.
"""

from __future__ import annotations

import csv
import functools
import json
import pathlib
import statistics
from dataclasses import dataclass
from importlib import resources

from longctx.specs import ModelSpec

TABLE = "vidur_h100_linear.json"
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
SMALL_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
OPS = GEMM_OPS + SMALL_OPS + ("emb",)
ADDS_PER_LAYER = 2  # two residual adds per layer (after attention, after the MLP)

# Layer counts are not in Vidur's files: from each model's config.json (num_hidden_layers / n_layer).
_HF = "https://huggingface.co/{}/blob/main/config.json"
MODEL_SOURCES = {
    "CodeLlama-34b-Instruct-hf": (48, _HF.format("codellama/CodeLlama-34b-Instruct-hf")),
    "Llama-2-70b-hf": (80, _HF.format("meta-llama/Llama-2-70b-hf")),
    "Qwen-72B": (80, _HF.format("Qwen/Qwen-72B")), "internlm-20b": (60, _HF.format("internlm/internlm-20b")),
    "phi-2": (32, _HF.format("microsoft/phi-2")),
}


@dataclass(frozen=True)
class ProfiledModel:
    """One model's profiles: its shape, and ``ms[tp][op]`` = median milliseconds at ``num_tokens[tp][i]``."""

    name: str
    shape: ModelSpec  # its layer shapes (a ModelSpec with its MLP kind and norms per layer)
    num_tokens: dict[int, tuple[int, ...]]
    ms: dict[int, dict[str, tuple[float, ...]]]

    @property
    def tp_degrees(self) -> tuple[int, ...]:
        return tuple(sorted(self.num_tokens))

    def op_s(self, tp: int, op: str) -> tuple[float, ...]:
        """Seconds of ``op`` at every profiled token count of ``tp`` (empty if the model has no such op)."""
        return tuple(v * 1e-3 for v in self.ms[self._tp(tp)].get(op, ()))

    def linear_time_s(self, tp: int = 1) -> list[float]:
        """Measured linear time (module docstring) at every profiled token count of ``tp``, in seconds."""
        ms, layers = self.ms[self._tp(tp)], self.shape.num_layers
        out = []
        for i in range(len(self.num_tokens[tp])):
            layer = sum(
                ms[op][i] * (ADDS_PER_LAYER if op == "add" else 1) for op in GEMM_OPS + SMALL_OPS if op in ms
            )
            out.append((layers * layer + ms["emb"][i]) * 1e-3)
        return out

    def _tp(self, tp: int) -> int:
        if tp not in self.num_tokens:
            raise ValueError(
                f"{self.name} was profiled at TP {', '.join(map(str, self.tp_degrees))}, not {tp!r}"
            )
        return tp


def _shape(name: str, meta: dict, source: str) -> ModelSpec:
    """A profiled model's shapes as a ``ModelSpec`` (its MLP kind and norms per layer as Vidur profiled
    them)."""
    return ModelSpec(
        name=name, source=source, num_layers=meta["num_layers"], d_model=meta["n_embd"],
        num_heads=meta["n_head"], num_kv_heads=meta["n_kv_head"], head_dim=meta["n_embd"] // meta["n_head"],
        intermediate_size=meta["n_expanded_embd"], gated_mlp=meta["use_gated_mlp"],
        vocab_size=meta["vocab_size"], norms_per_layer=meta["norms_per_layer"],
    )


@functools.cache
def load_profiles(path: str | None = None) -> dict[str, ProfiledModel]:
    """The shipped table (or the JSON at ``path``) as ``{model name: ProfiledModel}``."""
    p = (
        pathlib.Path(path)
        if path
        else pathlib.Path(str(resources.files("longctx"))) / "data" / "profiles" / TABLE
    )
    if not p.is_file():
        raise ValueError(
            f"no profile table at {p}: rebuild it with longctx.sim.profiles.table_from_vidur_csvs"
        )
    raw = json.loads(p.read_text())
    out = {}
    for name, m in raw["models"].items():
        toks = {int(tp): tuple(v["num_tokens"]) for tp, v in m["tp"].items()}
        ms = {int(tp): {op: tuple(x) for op, x in v["ms"].items()} for tp, v in m["tp"].items()}
        out[name] = ProfiledModel(name, _shape(name, m["shape"], m["config_source"]), toks, ms)
    return out


def _median_column(op: str) -> str:
    return f"time_stats.{op}.median"  # Vidur's CSV column of an operator's median time


def _median_ms(rows: list[dict], op: str) -> float:
    """The median over ``rows`` of an operator's median time, to 5 significant digits."""
    return float(f"{statistics.median(float(r[_median_column(op)]) for r in rows):.5g}")


def table_from_vidur_csvs(folder: str | pathlib.Path, commit: str, licence_text: str) -> dict:
    """The JSON table from Vidur's ``h100_<model>_mlp.csv`` files in ``folder`` (medians of duplicate
    rows)."""
    models = {}
    for name, (layers, source) in MODEL_SOURCES.items():
        rows = list(csv.DictReader(open(pathlib.Path(folder) / f"h100_{name}_mlp.csv", newline="")))
        if not rows:
            raise ValueError(f"{folder}/h100_{name}_mlp.csv has no rows")
        ops = [op for op in OPS if _median_column(op) in rows[0]]
        points: dict[tuple[int, int], list[dict]] = {}
        for r in rows:
            points.setdefault((int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])), []).append(r)
        tps = {}
        for tp in sorted({k[0] for k in points}):
            ns = sorted(n for t, n in points if t == tp)
            tps[str(tp)] = {
                "num_tokens": ns,
                "ms": {
                    op: [
                        _median_ms(points[(tp, n)], op)
                        for n in ns
                    ]
                    for op in ops
                },
            }
        r0 = rows[0]
        shape = {k: int(r0[k]) for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size")}
        shape.update(use_gated_mlp=r0["use_gated_mlp"] == "True", num_layers=layers,
                     norms_per_layer=sum(op in ops for op in ("input_layernorm", "post_attention_layernorm")))
        models[name] = {"config_source": source, "shape": shape, "tp": tps}
    return {
        "what": "median GPU time (ms) of each operator of one transformer layer on an NVIDIA H100, per "
        "tensor-parallel degree and token count; layer counts from each model's config.json",
        "source": {
            "project": "Vidur (microsoft/vidur)", "url": "https://github.com/microsoft/vidur",
            "files": "data/profiling/compute/h100/<model>/mlp.csv", "commit": commit, "licence": "MIT",
            "copyright": "Copyright (c) Microsoft Corporation.", "licence_text": licence_text,
        },
        "derived_by": "longctx.sim.profiles.table_from_vidur_csvs: the median over the rows of each "
        "(TP, tokens) point of each operator's time_stats.<op>.median, 5 significant digits",
        "models": models,
    }
