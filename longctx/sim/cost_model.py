"""A cost-model executor: how long one engine iteration would take on a GPU, from FLOPs and bytes.

One iteration runs a batch of entries, each ``(new_tokens, cached_tokens)``: a prefill chunk of C tokens
after S cached tokens, or a decode (C = 1). The batch's ``T = sum(C)`` new tokens go through the weights
together. Two forms price it (``form=``):

``"operator"`` (the default): every weight matrix of every layer on its own roofline, as a GPU runs it
(``longctx.sim.operators``: fused QKV, O, gate+up, down, each with compute and memory efficiency, tile
quantization and a kernel overhead), plus the small per-token ops, the embedding and the LM head (one
logit row per entry), and the attention of each entry::

    linear_s    = L * (sum of the 4 GEMMs over T tokens + small ops) + embedding + LM head (E rows)
    attention_s = max(attention_flops / (peak * attention_efficiency), KV bytes / (bandwidth *
    memory_efficiency)) step_s      = step_overhead_s + per_sequence_overhead_s * E + linear_s + attention_s

  ``linear_time_s(n, tp)`` is ``linear_s`` without the LM head: what Vidur's H100 profiles measure. The
  attention term is the course's FLOPs and KV bytes on a roofline, *not* measured by those profiles.
  With a measured ``GemmProfile`` (``gemm_profile=``, ``longctx.sim.gemm_profile``) the GEMMs, the small
  ops, the LM head and the attention of fresh prompt chunks are its seconds instead of rooflines: how
  ``benchmarks/sim_fidelity.py`` models the engine on a CPU.

``"batch"`` (the earlier, whole-batch form, which lessons teach as "the roofline"): one roofline for the
whole step::

    compute_s = linear_flops / (peak * compute_efficiency) + attention_flops / (peak * attention_efficiency)
    memory_s  = (weight + KV read + KV write bytes) / (bandwidth * memory_efficiency)
    step_s    = step_overhead_s + per_sequence_overhead_s * E + max(compute_s, memory_s)

FLOPs and bytes follow ``longctx.flops.step_cost`` (``params`` and ``attention`` explicit); KV bytes are
what the paged pool holds per token, ``longctx.kv.quant.pool_bytes_per_token``, scales included. With
efficiencies in (0, 1] and overheads >= 0 no step beats the roofline.

Defaults (``CostFactors()``): the GEMM, small-op and tile factors are **fitted** on Vidur's published H100
profiles (``longctx.sim.calibration.fit_profiles``; Vidur, MIT); attention efficiency and the step and
per-sequence overheads are **assumed** (no published measurement). ``CostFactors.assumed()`` holds the
earlier assumed factors, the ``"batch"`` form's default. Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable

from longctx import checks, flops
from longctx.engine.executor import ExecutionResult, Executor
from longctx.kv.quant import pool_bytes_per_token
from longctx.memory import evicted_tokens
from longctx.sim.factors import COST_FORMS, CostFactors, StepBreakdown, StepFeatures
from longctx.sim.gemm_profile import LAYER_GROUPS, GemmProfile
from longctx.sim.operators import check_tp, embedding_time_s, gemm_time_s, layers_time_s, lm_head_rows
from longctx.sim.step_terms import operator_breakdown
from longctx.specs import HardwareSpec, ModelSpec, dtype_bytes, get_hardware, get_model


class CostModelExecutor(Executor):
    """An ``Executor`` that returns the modelled time of a batch on ``hardware`` for ``model``.

    Args:
        model, hardware: registry names or specs (``longctx.specs``).
        factors: ``CostFactors`` (default: ``CostFactors()``, fitted H100 values, for ``"operator"``;
            ``CostFactors.assumed()`` for ``"batch"``).
        weight_dtype, kv_dtype: storage dtypes of the weights and the KV cache (bytes moved; KV bytes per
            token are ``quant.pool_bytes_per_token``, scales included). Activations move in fp32 with fp32
            weights, else in bf16.
        attention: ``"causal"`` (FlashAttention convention) or ``"full"``.
        params: the linear-FLOP convention of ``longctx.flops`` (``"matmul"``, the course's, or ``"all"``;
            the ``"operator"`` form always counts the matrices it times, which is ``"matmul"``).
        kv_compression_ratio: KV pruning modelled as a press would do it in the engine: when a prefill
            ends, ``floor(ratio * T)`` of its ``T`` cached tokens are evicted (their blocks freed, later
            steps read fewer KV bytes). The press's own scoring time is not charged. 0: no pruning.
        form: ``"operator"`` (default) or ``"batch"`` (module docstring).
        gemm_profile: a ``GemmProfile`` of ``model`` measured on the machine being modelled
            (``longctx.sim.gemm_profile``): the operator form then prices the GEMMs, the small ops, the LM
            head and a fresh prompt chunk's attention from it (measured seconds, tensor parallelism 1) instead
            of from their rooflines.
    """

    def __init__(
        self, model: ModelSpec | str, hardware: HardwareSpec | str, factors: CostFactors | None = None,
        weight_dtype: str = "bf16", kv_dtype: str = "bf16", attention: str = "causal", params: str = "matmul",
        kv_compression_ratio: float = 0.0, form: str = "operator", gemm_profile: GemmProfile | None = None,
    ) -> None:
        checks.eviction_fraction("kv_compression_ratio", kv_compression_ratio)
        if attention not in flops.ATTENTION_KINDS:
            raise ValueError(
                f"attention must be one of {', '.join(flops.ATTENTION_KINDS)}; got {attention!r}"
            )
        if form not in COST_FORMS:
            raise ValueError(f"form must be one of {', '.join(COST_FORMS)}; got {form!r}")
        self.kv_compression_ratio = float(kv_compression_ratio)
        self.form = form
        self.model = m = get_model(model)
        if gemm_profile is not None and (form != "operator" or gemm_profile.model != m.name):
            raise ValueError(
                f"gemm_profile needs form='operator' and a profile of {m.name}; got form={form!r} and a "
                f"profile of {gemm_profile.model}"
            )
        self.gemm_profile = gemm_profile
        self.hardware = get_hardware(hardware)
        if factors is None:
            factors = CostFactors() if form == "operator" else CostFactors.assumed()
        self.factors = factors
        self.weight_dtype, self.kv_dtype, self.attention, self.params = (
            weight_dtype, kv_dtype, attention, params,
        )
        self.weight_elem_bytes = dtype_bytes(weight_dtype)
        self.act_elem_bytes = 4.0 if str(weight_dtype).lower() == "fp32" else 2.0
        # flops.step_cost's terms, per unit: linear in tokens, in logit rows (one per entry) and in pairs.
        self._linear_flops_per_token = flops.linear_flops(m, 1, params, logit_tokens=0)
        self._linear_flops_per_entry = (flops.linear_flops(m, 1, params, logit_tokens=1)
                                        - self._linear_flops_per_token)
        self.attention_flops_per_pair = flops.attention_flops(m, 1, "full")  # one (query, key) pair
        self.weight_bytes = flops.step_cost(m, [], attention, params, weight_dtype, kv_dtype).weight_bytes
        self.kv_bytes_per_token = pool_bytes_per_token(m, kv_dtype)  # scales included (fp8/int8/int4)
        self._layers_cache: dict[tuple[int, int], float] = {}  # (tokens, tp) -> seconds (operator form)
        self._head_cache: dict[int, float] = {}  # logit rows -> LM head seconds

    # ---- the linear part, operator by operator ----
    def _gemm_s(self, n: int, k: float, m: float) -> float:
        hw = self.hardware
        return gemm_time_s(n, k, m, self.factors, hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s,
                           self.weight_elem_bytes, self.act_elem_bytes)

    def _layers_s(self, n: int, tp: int) -> float:
        """All layers' GEMMs and small ops, plus the embedding, for ``n`` tokens on one of ``tp`` GPUs."""
        key = (n, tp)
        t = self._layers_cache.get(key)
        if t is None and self.gemm_profile is not None:
            if tp != 1:
                raise ValueError(f"a GemmProfile is measured at tensor parallelism 1; got tp={tp}")
            p, hw = self.gemm_profile, self.hardware
            # + the embedding lookup
            t = self._layers_cache[key] = sum(p.seconds_at(g, n) for g in LAYER_GROUPS) + embedding_time_s(
                self.model, n, self.factors, hw.memory_bandwidth_bytes_per_s, self.act_elem_bytes
            )
        if t is None:
            hw = self.hardware
            t = self._layers_cache[key] = layers_time_s(
                self.model, n, self.factors, hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s,
                self.weight_elem_bytes, self.act_elem_bytes, tp,
            )
        return t

    def _lm_head_s(self, rows: int) -> float:
        t = self._head_cache.get(rows)
        if t is None:
            v = lm_head_rows(self.model)
            if self.gemm_profile is not None:
                t = self.gemm_profile.seconds_at("lm_head", rows)
            else:
                t = self._gemm_s(rows, self.model.d_model, v) if v and rows else 0.0
            self._head_cache[rows] = t
        return t

    def linear_time_s(self, num_tokens: int, tp: int = 1) -> float:
        """Modelled seconds of one step's weight operators and per-token ops for ``num_tokens`` new tokens
        on one of ``tp`` GPUs: no attention, no LM head, no step overhead; what Vidur's profiles measure.
        The ``"batch"`` form: ``max(2 n N_layers / (peak ce), N_layers b / (bandwidth me)) / tp``."""
        n = flops.check_token_count("num_tokens", num_tokens)
        tp = check_tp(tp)
        if self.form == "operator":
            return self._layers_s(n, tp)
        k, hw, lin = self.factors, self.hardware, flops.linear_params(self.model, "matmul")
        return (
            max(
                2 * n * lin / (hw.peak_flops_per_s * k.compute_efficiency),
                lin * self.weight_elem_bytes / (hw.memory_bandwidth_bytes_per_s * k.memory_efficiency),
            )
            / tp
        )

    # ---- the cost of a list of (new_tokens, cached_tokens) ----
    def totals(self, sequences: Iterable[tuple[int, int]]) -> tuple[int, int, int, int]:
        """``(new tokens, attention pairs, cached tokens, entries)`` of a step's ``(new, cached)`` pairs (a
        decode
        attends its ``S + 1`` keys; a chunk ``flops.attention_pairs`` under this executor's convention)."""
        tokens = pairs = cached = n = 0
        for c, s in sequences:
            tokens += c
            cached += s
            pairs += s + 1 if c == 1 else flops.attention_pairs(c, s, self.attention)  # a decode: S + 1 keys
            n += 1
        return tokens, pairs, cached, n

    def features(self, sequences: Iterable[tuple[int, int]]) -> StepFeatures:
        """Ideal compute and memory times of a step (``flops.step_cost``'s FLOPs and bytes over the
        roofline)."""
        tokens, pairs, cached, n = self.totals(sequences)
        peak = self.hardware.peak_flops_per_s
        attention_flops, kv_bytes = self.attention_work(tokens, pairs, cached)
        num_bytes = self.weight_bytes + kv_bytes
        return StepFeatures(
            linear_s=(tokens * self._linear_flops_per_token + n * self._linear_flops_per_entry) / peak,
            attention_s=attention_flops / peak,
            memory_s=num_bytes / self.hardware.memory_bandwidth_bytes_per_s, num_sequences=n,
        )

    def breakdown(self, sequences: Iterable[tuple[int, int]]) -> StepBreakdown:
        """The step's modelled time and its parts (``StepBreakdown``)."""
        k = self.factors
        if self.form == "batch":
            f = self.features(sequences)
            compute_s = f.linear_s / k.compute_efficiency + f.attention_s / k.attention_efficiency
            memory_s = f.memory_s / k.memory_efficiency
            overhead_s = k.step_overhead_s + k.per_sequence_overhead_s * f.num_sequences
            return StepBreakdown(compute_s, memory_s, overhead_s, max(compute_s, memory_s))
        return operator_breakdown(self, sequences)

    def step_time_s(self, sequences: Iterable[tuple[int, int]]) -> float:
        """Modelled seconds of one step over ``(new_tokens, cached_tokens)`` pairs."""
        if self.form == "batch":
            return self.breakdown(sequences).time_s
        if self.gemm_profile is not None:
            return self._profiled_step_s(sequences)
        return self._operator_step_s(*self.totals(sequences))

    def profiled_parts(
        self, sequences: Iterable[tuple[int, int]]
    ) -> tuple[float, list[tuple[int, int]], int, int]:
        """With a ``GemmProfile``: ``(measured_s, modelled, tokens, entries)``: the measured seconds of the
        step's GEMMs, small ops, LM head and fresh prompt chunks' attention (nothing cached: the profile's
        ``causal_attention``), and the entries whose attention stays modelled (decodes, chunks after a
        prefix)."""
        seqs = list(sequences)
        p, fresh_s, modelled, tokens = self.gemm_profile, 0.0, [], 0
        for c, s in seqs:
            tokens += c
            if c > 1 and s == 0:
                fresh_s += p.seconds_at("causal_attention", c)
            else:
                modelled.append((c, s))
        return self._layers_s(tokens, 1) + self._lm_head_s(len(seqs)) + fresh_s, modelled, tokens, len(seqs)

    def _profiled_step_s(self, sequences) -> float:
        measured, modelled, _, n = self.profiled_parts(sequences)
        k = self.factors
        attention = self._attention_s(*self.totals(modelled)[:3]) if modelled else 0.0
        return k.step_overhead_s + k.per_sequence_overhead_s * n + measured + attention

    def attention_work(self, tokens: int, pairs: int, cached: int) -> tuple[float, float]:
        """The attention's work, the one definition: ``(FLOPs of its (query, key) pairs, KV bytes of its
        cached + new tokens)`` (``features``, the operator form and ``step_terms`` all price these)."""
        return pairs * self.attention_flops_per_pair, (cached + tokens) * self.kv_bytes_per_token

    def _attention_s(self, tokens: int, pairs: int, cached: int) -> float:
        """The attention roofline: its FLOPs at attention efficiency, or its KV bytes at memory efficiency."""
        k, hw = self.factors, self.hardware
        attention_flops, kv_bytes = self.attention_work(tokens, pairs, cached)
        return max(attention_flops / (hw.peak_flops_per_s * k.attention_efficiency),
                   kv_bytes / (hw.memory_bandwidth_bytes_per_s * k.memory_efficiency))

    def _operator_step_s(self, tokens: int, pairs: int, cached: int, n: int) -> float:
        k = self.factors
        return (k.step_overhead_s + k.per_sequence_overhead_s * n + self._layers_s(tokens, 1)
                + self._lm_head_s(n) + self._attention_s(tokens, pairs, cached))

    # ---- the Executor protocol ----
    def execute(self, batch) -> ExecutionResult:
        """The modelled time of a ``ScheduledBatch`` (read before the engine updates its sequences)."""
        # (new tokens, cached KV tokens: Sequence.num_cached_tokens). A prefix-cache hit is already in
        # num_computed_tokens (ScheduledBatch.add): its tokens are read as
        # cached context, never charged as new (prefilled) tokens.
        # hot path
        if self.form == "operator" and not self.kv_compression_ratio and self.gemm_profile is None:
            pairs = ((e.num_tokens, e.seq.num_cached_tokens) for e in batch.entries)
            return ExecutionResult(self._operator_step_s(*self.totals(pairs)), None, None)
        seqs = [(e.num_tokens, e.seq.num_cached_tokens) for e in batch.entries]
        evicted = None
        if self.kv_compression_ratio:
            evicted = {}
            for (n, cached), e in zip(seqs, batch.entries, strict=True):
                if e.completes_prefill and not e.is_decode:  # this step ends its prefill
                    evicted[e.seq.seq_id] = evicted_tokens(cached + n, self.kv_compression_ratio)
        return ExecutionResult(
            duration_s=self.step_time_s(seqs), next_token_ids=None, evicted_tokens=evicted or None
        )

    def with_factors(self, factors: CostFactors) -> CostModelExecutor:
        return CostModelExecutor(
            self.model, self.hardware, factors, self.weight_dtype, self.kv_dtype, self.attention, self.params,
            self.kv_compression_ratio, self.form, self.gemm_profile,
        )

    def __repr__(self) -> str:
        return (
            f"CostModelExecutor({self.model.name}, {self.hardware.name}, form={self.form!r}, {self.factors})"
        )
