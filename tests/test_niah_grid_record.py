"""The shipped needle grids and depth-1 probe of lesson 05 meet issue 29's evidence bar: recorded on a quiet
machine with provenance, independent trials (own needle value and filler per trial), the same number of trials
in every (length, depth) cell, and the lesson's prose quoting what the records hold."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest

from longctx.evals.stats import fisher_exact
from longctx.recorded import recorded_path

ROOT = Path(__file__).resolve().parents[1]
GRIDS = ("niah_grid_passkey.json", "niah_grid_multikey.json")
PROVENANCE = ("date", "machine", "commit", "torch", "torch_threads", "load_average_1min_start", "n")
# Issue 29 asks for 10 trials per (length, depth) cell; the recording (benchmarks/niah_grid.py, resumable,
# trial-
# major) is committed whole rounds at a time, so every cell has the same count. This is the count shipped.
TRIALS_PER_CELL = 10
LESSON = ROOT / "solutions" / "05_attention_diffusion" / "05_attention_diffusion.ipynb"


def load(name):
    return json.loads(recorded_path(name).read_text())


def lesson_text() -> str:
    nb = json.loads(LESSON.read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


@pytest.mark.parametrize("name", [*GRIDS, "niah_depth1.json"])
def test_each_record_is_usable_and_carries_its_provenance(name):
    data = load(name)
    meta = data["meta"]
    for key in PROVENANCE:
        assert meta.get(key) is not None, f"{name}: meta has no {key}"
    assert meta["record_version"] == 2 and meta["usable"] is True
    for run in meta["runs"]:  # every (resumed) run started on a machine no busier than its threads
        assert run["load_average_1min_start"] <= run["torch_threads"], f"{name}: a run started at {run}"
        assert run["usable"] is True
    assert meta["n"] == len(data["rows"])
    assert all(row["usable"] for row in data["rows"])


@pytest.mark.parametrize("name", GRIDS)
def test_every_cell_has_the_same_number_of_independent_trials(name):
    rows = load(name)["rows"]
    cells = collections.defaultdict(list)
    for r in rows:
        cells[(r["length"], r["depth"])].append(r)
    assert len({n for n, _ in cells}) >= 4 and len({d for _, d in cells}) == 5
    for cell, trials in cells.items():
        assert sorted(r["trial"] for r in trials) == list(range(TRIALS_PER_CELL)), (
            f"{cell}: trials {len(trials)}"
        )
        assert len({r["answer"] for r in trials}) == len(trials), f"{cell}: a needle value repeats"
    assert len({r["seed"] for r in rows}) == len(rows), "a seed is reused across cells"
    per_length = collections.Counter(r["length"] for r in rows)
    assert min(per_length.values()) >= 20


def test_the_grid_and_the_depth_one_probe_agree_on_their_shared_trials():
    """Depth 1 of the passkey grid at 1,024 tokens and the probe's "depth 1" at 1,024 are the same prompts."""
    probe = {r["seed"]: r for r in load("niah_depth1.json")["rows"] if r["variant"] == "depth 1"}
    shared = [r for r in load("niah_grid_passkey.json")["rows"] if r["depth"] == 1.0 and r["seed"] in probe]
    assert len(shared) >= 5
    for r in shared:
        assert (r["output"], r["correct"]) == (probe[r["seed"]]["output"], probe[r["seed"]]["correct"])


def test_the_depth_one_probe_has_twenty_trials_per_length_and_variant():
    rows = load("niah_depth1.json")["rows"]
    count = collections.Counter((r["variant"], r["length"]) for r in rows)
    assert len(count) == 14 and min(count.values()) >= 20
    seeds = collections.defaultdict(set)
    for r in rows:
        seeds[r["variant"]].add(r["seed"])
    assert len({frozenset(s) for s in seeds.values()}) == 1, "every variant runs on the same trials"


def test_the_lesson_quotes_the_depth_one_record():
    rows = load("niah_depth1.json")["rows"]
    text = lesson_text()
    tally = {}
    for r in rows:
        k, n = tally.get(r["variant"], (0, 0))
        tally[r["variant"]] = (k + r["correct"], n + 1)
    base_k, base_n = tally["depth 1"]
    assert f"{base_k}/{base_n}" in text
    for variant in (
        "32 filler tokens between", "filler ends a sentence", "no blank lines", "junction re-tokenized",
    ):
        k, n = tally[variant]
        assert f"{k}/{n}" in text, f"the lesson does not quote {variant}'s {k}/{n}"
        assert fisher_exact(k, n, base_k, base_n) < 0.05, f"the lesson calls {variant} significant"
    same = {r["seed"]: r["correct"] for r in rows if r["variant"] == "depth 1"}
    assert all(same[r["seed"]] == r["correct"] for r in rows if r["variant"] == "no answer prefix"), \
        "the lesson says removing the answer prefix changes no verdict"


BEYOND_VARIANTS = ("none", "linear x2", "ntk x2", "yarn x2")


def test_beyond_eight_k_has_ten_independent_trials_per_variant_on_the_same_prompts():
    data = load("niah_beyond.json")
    meta = data["meta"]
    assert meta["record_version"] == 2 and meta["usable"] is True
    # The record's two halves (none + linear, ntk + yarn) were started together, one thread each; their start
    # load
    # was read after both had loaded the model, so it includes each other: the bound is the threads of the
    # runs
    # that started in the same second.
    together = collections.Counter()
    for run in meta["runs"]:
        together[run["date"]] += run["torch_threads"]
    for run in meta["runs"]:
        assert run["load_average_1min_start"] <= together[run["date"]], f"a run started at {run}"
    assert all(r["load_1min"] - 1 <= 1 for r in data["rows"]), (
        "a trial started while other work loaded the machine"
    )
    seeds = collections.defaultdict(list)
    for r in data["rows"]:
        assert r["length"] > 8192 and r["usable"]
        seeds[r["rope"]].append(r["seed"])
    assert set(seeds) == set(BEYOND_VARIANTS)
    assert len({tuple(sorted(s)) for s in seeds.values()}) == 1, "every variant answers the same prompts"
    one = seeds["none"]
    assert len(one) >= 10 and len(set(one)) == len(one), "at least 10 independent trials per variant"
    assert len({r["answer"] for r in data["rows"] if r["rope"] == "none"}) == len(one), (
        "a needle value repeats"
    )


def test_the_lesson_quotes_the_beyond_record():
    rows = load("niah_beyond.json")["rows"]
    text = " ".join(lesson_text().split())
    for label, variant in zip(("no scaling", "PI", "NTK-aware", "YaRN"), BEYOND_VARIANTS, strict=True):
        got = [r["correct"] for r in rows if r["rope"] == variant]
        assert f"{label} {sum(got)}/{len(got)}" in text, (
            f"the lesson does not quote {variant}'s {sum(got)}/{len(got)}"
        )


def _effective(rows, threshold=0.8):
    """Exercise 5.2's rule: the longest length up to which every length's Wilson lower bound reaches
    threshold."""
    from longctx.evals.stats import wilson_interval

    best = 0
    for n in sorted({r["length"] for r in rows}):
        got = [r["correct"] for r in rows if r["length"] == n]
        if wilson_interval(sum(got), len(got))[0] < threshold:
            break
        best = n
    return best


def test_the_grid_conclusions_quote_the_grids():
    """Every "passkey 1,024: 47/50" in the lesson is what the record holds; the effective contexts it states
    are the ones exercise 5.2's rule gives on the records."""
    text = lesson_text()
    grids = {
        "passkey": load("niah_grid_passkey.json")["rows"],
        "multikey": load("niah_grid_multikey.json")["rows"],
    }
    quotes = re.findall(r"(passkey|multikey)\s+([\d,]+):\s+(\d+)/(\d+)", text)
    assert len(quotes) >= 8, quotes
    for grid, length, k, n in quotes:
        got = [r["correct"] for r in grids[grid] if r["length"] == int(length.replace(",", ""))]
        assert (int(k), int(n)) == (sum(got), len(got)), f"{grid} {length}: the lesson says {k}/{n}"
    stated = {"passkey": 0, "multikey": 0}
    for grid, value in stated.items():
        assert _effective(grids[grid]) == value
    assert "both effective contexts are 0" in text
    without = _effective([r for r in grids["passkey"] if r["depth"] < 1])
    assert f"without depth 1 passkey holds up to {without:,}" in text
