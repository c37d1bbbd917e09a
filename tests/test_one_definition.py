"""Issue 24, "one house": each of these concepts is defined once in ``longctx/``, and this test fails when a
second definition appears. It scans the package's source with ``ast``:

- serving metrics (per-request latencies, the SLO, the latency distributions, the run aggregate,
  percentiles): ``longctx/request_metrics.py``
- tokens -> blocks rounding, ``ceil(tokens / block_size)``: ``memory.blocks_for_tokens``
- KV-pool sizing, the blocks that fit a byte budget: ``memory.blocks_that_fit``
- KV bytes per token, ``2 * L * H_kv * (...)``: ``memory.kv_bytes_per_token``
- Poisson (gamma) arrivals: ``arrivals.arrival_times``
- the decode-stall scenario (its sizes, its napkin timeline, its engine run, its server requests):
  ``lessons/stall.py`` (``StallScenario``; ``Exercise1`` is an alias); ``lessons/stall_server.py`` only sends
  it
- a request of a workload (arrival, prompt and output tokens): ``sim/workload.Request``; a step's record:
  ``engine/step_records.StepRecord`` (the engine's history and every timeline; ``sim.MeasuredStep`` is a
  different thing, a calibration sample: a batch's entries and its measured time)

Issue 45 adds: an entry enters a batch one way (``ScheduledBatch._append``, which alone counts a decode);
a sequence's cached K/V entries (``Sequence.num_cached_tokens``, never ``computed - evicted`` inlined); the
attention's work in the simulator (``CostModelExecutor.attention_work``); a roofline result's fields
(``roofline.RooflineTime``; ``sim.factors.StepBreakdown`` extends it); the pool's bytes per token with its
scale layouts (``kv.quant.pool_bytes_per_token``, under that one name) and the pool's
size (``plan.pool_blocks``; ``sim.kv_pool_blocks`` calls it); the evicted count (``memory.evicted_tokens``);
the token-budget schedulers' constructor (``engine.scheduler.TokenBudgetScheduler``); argument checks
(``longctx/checks.py``); the model's shape (``specs.ModelSpec``; the simulator's ``LayerShape`` retired).

Two checks: a ``def`` / ``class`` of each canonical name exists in its home module only, and the formula
itself (an inline ceil-division, a ``num_layers * num_kv_heads`` product, a budget divided by
``block_size * bytes``, an exponential or gamma draw, ``np.percentile``, a class with latency fields)
appears nowhere else. Other modules may import the names (re-exports) or alias them (``SLOs = SLO``).
The last test feeds the scanner known duplicates, so it is seen to catch them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import longctx

PACKAGE = Path(longctx.__file__).resolve().parent

HOMES = {  # a def or class name -> the one module (relative to longctx/) that defines it
    "blocks_for_tokens": "memory.py",
    "blocks_that_fit": "memory.py",
    "kv_bytes_per_token": "memory.py",
    "arrival_times": "arrivals.py",
    "RequestMetrics": "request_metrics.py",
    "from_timestamps": "request_metrics.py",
    "SLO": "request_metrics.py",
    "Distribution": "request_metrics.py",
    "RunMetrics": "request_metrics.py",
    "percentile": "request_metrics.py",
    "StallScenario": "lessons/stall.py",
    "NapkinCosts": "lessons/stall.py",
    "StallResult": "lessons/stall.py",
    "exercise1": "lessons/stall.py",
    "run_stall": "lessons/stall_server.py",
    "StepRecord": "engine/step_records.py",
    "step_kind": "engine/step_records.py",
    "Request": "sim/workload.py",
    # issue 45
    "_append": "engine/batch.py",  # the one way an entry enters a batch (a decode too)
    "num_cached_tokens": "engine/sequence.py",
    "attention_work": "sim/cost_model.py",
    "RooflineTime": "roofline.py",
    "pool_bytes_per_token": "kv/quant.py",
    "scale_layout": "kv/quant.py",
    "pool_blocks": "plan.py",
    "kv_pool_blocks": "sim/run.py",
    "evicted_tokens": "memory.py",
    "TokenBudgetScheduler": "engine/scheduler.py",
    "press_from_options": "engine/pruning.py",
    "check_token_count": "checks.py",
    "nonnegative_number": "checks.py",
    "positive_number": "checks.py",
    "unit_fraction": "checks.py",
    "eviction_fraction": "checks.py",  # a press's compression ratio, in [0, 1): the press and the cost model
    "ChunkSlots": "kv/step_metadata.py",  # a chunk's cache slots (the engine's chunk is ScheduledChunk)
    "positive_int": "checks.py",
    "ModelSpec": "specs.py",  # the model's shape: the simulator's operators read it too
    "gemm_dims": "sim/operators.py",
}
RETIRED = ("blocks_needed", "SLOs", "distribution_ms", "pool_gib_blocks", "Exercise1", "Exercise1Result",
           "stall_requests", "IterationRecord", "iteration_kind", "ToyRequest", "BacklogRequest",
           # issue 45
           "_nonnegative", "_efficiency", "is_prefill_in_progress", "stream_itl_s", "LayerShape",
           "make_cli_press_copy")  # old duplicates: aliases at most

FORMULA_HOMES = {  # concept -> (module, function) where its formula may be written; None: anywhere in it
    "ceil division": ("memory.py", "blocks_for_tokens"),
    "KV bytes per token": ("memory.py", "kv_bytes_per_token"),
    "pool sizing": ("memory.py", "blocks_that_fit"),
    "arrival gaps": ("arrivals.py", "arrival_times"),
    "percentile": ("request_metrics.py", None),
    "latency fields": ("request_metrics.py", None),
    # issue 45
    "decode counted": ("engine/batch.py", "_append"),
    "cached tokens": ("engine/sequence.py", "num_cached_tokens"),
    "attention work": ("sim/cost_model.py", "attention_work"),
    "roofline fields": ("roofline.py", None),
    "evicted count": ("memory.py", "evicted_tokens"),
    "budget constructor": ("engine/scheduler.py", "__init__"),
}
LATENCY_FIELDS = {"ttft_s", "tpot_s", "itl_s", "e2e_s"}
ARRIVAL_DRAWS = {"exponential", "standard_exponential", "gamma", "standard_gamma", "poisson"}


def _names(node: ast.AST) -> set[str]:
    """Every identifier in ``node``: names, attribute names and called functions' names."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def _neg(node: ast.AST) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)


def _concept(node: ast.AST) -> str | None:
    """Which concept's formula ``node`` writes, if any."""
    if _neg(node) and isinstance(node.operand, ast.BinOp) and isinstance(node.operand.op, ast.FloorDiv) \
            and _neg(node.operand.left):
        return "ceil division"  # -(-a // b)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
        left = node.left  # (a + b - 1) // b
        if (
            isinstance(left, ast.BinOp)
            and isinstance(left.op, ast.Sub)
            and isinstance(left.right, ast.Constant)
            and left.right.value == 1
            and isinstance(left.left, ast.BinOp)
            and isinstance(left.left.op, ast.Add)
            and ast.dump(node.right) in (ast.dump(left.left.left), ast.dump(left.left.right))
        ):
            return "ceil division"
        right = {x.lower() for x in _names(node.right)}
        if any("block" in x for x in right) and any("byte" in x or x == "bpt" for x in right):
            return "pool sizing"  # budget // (block_size * bytes_per_token)
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if (
            name == "ceil"
            and node.args
            and isinstance(node.args[0], ast.BinOp)
            and isinstance(node.args[0].op, ast.Div)
            and any("block" in x for x in _names(node.args[0].right))
        ):
            return "ceil division"  # math.ceil(tokens / block_size)
        if isinstance(f, ast.Attribute) and name in ARRIVAL_DRAWS:
            return "arrival gaps"  # rng.exponential(1 / rate, n)
        if isinstance(f, ast.Attribute) and name == "percentile" and _names(f.value) & {"np", "numpy"}:
            return "percentile"  # np.percentile(values, q)
    if (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mult)
        and {"num_layers", "num_kv_heads"} <= _names(node)
    ):
        return "KV bytes per token"  # 2 * m.num_layers * m.num_kv_heads * ...
    if isinstance(node, ast.ClassDef) and any(
            isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id in LATENCY_FIELDS
            for s in node.body):
        return "latency fields"  # a second RequestMetrics or SLO
    return _concept_45(node)


def _fields(node: ast.ClassDef) -> set[str]:
    return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def _concept_45(node: ast.AST) -> str | None:
    """Issue 45's concepts (see ``FORMULA_HOMES``)."""
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute) \
            and node.target.attr == "num_decode_tokens":
        return "decode counted"  # batch.num_decode_tokens += 1: a second way to add a decode
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) \
            and "num_evicted_tokens" in _names(node.right) and "num_computed_tokens" in _names(node.left):
        return "cached tokens"  # computed - evicted, inlined
    if (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mult)
        and "attention_flops_per_pair" in _names(node)
    ):
        return "attention work"  # pairs * flops per pair
    if isinstance(node, ast.ClassDef) and {"compute_s", "memory_s"} <= _fields(node):
        return "roofline fields"  # a second roofline result
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) \
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) in ("floor", "int") \
            and node.args and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Mult) \
            and any("ratio" in x for x in _names(node.args[0])):
        return "evicted count"  # floor(compression_ratio * tokens)
    if isinstance(node, ast.FunctionDef) and node.name == "__init__" \
            and [a.arg for a in node.args.args] == ["self", "token_budget", "max_num_seqs"]:
        return "budget constructor"  # a scheduler's (token_budget, max_num_seqs) constructor
    return None


def scan(module: str, tree: ast.AST) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    """``(definitions, formulas)`` of one module: ``(name, module, line)`` of every def / class, and
    ``(concept, module:function, line)`` of every formula written outside its home."""
    defs, formulas = [], []

    def visit(node: ast.AST, func: str | None, inside: frozenset) -> None:
        for child in ast.iter_child_nodes(node):
            inner, within = func, inside
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs.append((child.name, module, child.lineno))
                if not isinstance(child, ast.ClassDef):
                    inner = child.name
            concept = _concept(child)
            if concept is not None and concept not in inside:  # a formula's sub-expressions count once
                within = inside | {concept}
                home_module, home_func = FORMULA_HOMES[concept]
                if module != home_module or (home_func is not None and inner != home_func):
                    formulas.append((concept, f"{module}:{inner or '<module>'}", child.lineno))
            visit(child, inner, within)

    visit(tree, None, frozenset())
    return defs, formulas


def _package() -> tuple[list, list]:
    defs, formulas = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        d, f = scan(module, ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        defs += d
        formulas += f
    return defs, formulas


DEFS, FORMULAS = _package()


@pytest.mark.parametrize("name", sorted(HOMES))
def test_each_canonical_name_is_defined_once_in_its_home(name):
    where = [(m, line) for n, m, line in DEFS if n == name]
    assert len(where) == 1 and where[0][0] == HOMES[name], (
        f"{name} must be defined once, in longctx/{HOMES[name]}; found {where}: import it from there instead")


def test_retired_duplicates_are_not_defined_again():
    again = [(n, m, line) for n, m, line in DEFS if n in RETIRED]
    assert not again, f"these names are aliases of the one definition now, not definitions: {again}"


def test_no_second_formula_outside_the_one_definition():
    assert not FORMULAS, "formulas written outside their one definition (call it instead):\n" + "\n".join(
        f"  {concept}: longctx/{where} line {line}" for concept, where, line in FORMULAS)


def test_aliases_and_re_exports_are_the_one_object():
    from longctx import arrivals, checks, engine, memory, plan, sim
    from longctx import request_metrics as metrics
    from longctx.bench import client_metrics as bench_metrics
    from longctx.kv import block_manager

    assert memory.blocks_needed is memory.blocks_for_tokens  # lesson 04's name
    assert block_manager.blocks_for_tokens is memory.blocks_for_tokens
    assert bench_metrics.SLOs is metrics.SLO and engine.SLO is metrics.SLO
    assert engine.summarize is metrics.summarize and engine.RequestMetrics is metrics.RequestMetrics
    assert sim.arrival_times is arrivals.arrival_times
    assert plan.memory is memory
    from longctx.kv import quant

    assert not hasattr(plan, "bytes_per_token")  # one name: quant.pool_bytes_per_token (issue 45)
    assert plan.scale_layout is quant.scale_layout
    assert memory.check_token_count is checks.check_token_count
    assert not hasattr(block_manager.BlockManager, "blocks_needed")  # extra_blocks_needed says what it counts
    from longctx.lessons import stall

    assert stall.Exercise1 is stall.StallScenario and stall.Exercise1Result is stall.StallResult


DUPLICATES = {
    "ceil division": [
        "def f(n, bs):\n    return -(-n // bs)\n",
        "def f(n, block_size):\n    return (n + block_size - 1) // block_size\n",
        "import math\ndef f(n, block_size):\n    return math.ceil(n / block_size)\n",
    ],
    "KV bytes per token": ["def f(m):\n    return 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2\n"],
    "pool sizing": [
        "def f(free, block_size, bytes_per_token):\n    return int(free // (block_size * bytes_per_token))\n"
    ],
    "arrival gaps": ["def f(rng, rate, n):\n    return rng.exponential(1.0 / rate, size=n).cumsum()\n"],
    "percentile": ["import numpy as np\ndef f(v):\n    return {'p99': float(np.percentile(v, 99))}\n"],
    "latency fields": ["class SLOs:\n    ttft_s: float | None = None\n"],
    "decode counted": [
        "def add_decode(batch, seq):\n    batch.entries.append(seq)\n    batch.num_decode_tokens += 1\n"
    ],
    "cached tokens": ["def f(seq):\n    return seq.num_computed_tokens - seq.num_evicted_tokens\n"],
    "attention work": ["def f(ex, pairs, peak):\n    return pairs * ex.attention_flops_per_pair / peak\n"],
    "roofline fields": ["class StepTime:\n    compute_s: float\n    memory_s: float\n"],
    "evicted count": [
        "import math\ndef f(ratio, n):\n    return math.floor(ratio * n)\n",
        "def f(self, n):\n    return int(self.kv_compression_ratio * n)\n",
    ],
    "budget constructor": [
        "class S:\n    def __init__(self, token_budget=512, max_num_seqs=256):\n"
        "        self.token_budget = token_budget\n"
    ],
}


@pytest.mark.parametrize("concept,source", [(c, s) for c, ss in DUPLICATES.items() for s in ss])
def test_the_scan_catches_a_duplicate_formula(concept, source):
    _, formulas = scan("bench/elsewhere.py", ast.parse(source))
    assert [c for c, _, _ in formulas] == [concept]
    home_module, home_func = FORMULA_HOMES[concept]
    home_source = source.replace("def f(", f"def {home_func or 'f'}(").replace(
        "def add_decode(", f"def {home_func}("
    )
    _, at_home = scan(home_module, ast.parse(home_source))
    assert not at_home  # the same formula in its home is the one definition


def test_the_scan_sees_every_definition():
    source = ("def blocks_for_tokens(n, bs):\n    return n\n"
              "class SLO:\n    def met_by(self, r):\n        return True\n")
    defs, _ = scan("bench/elsewhere.py", ast.parse(source))
    assert [(n, line) for n, _, line in defs] == [("blocks_for_tokens", 1), ("SLO", 3), ("met_by", 4)]
