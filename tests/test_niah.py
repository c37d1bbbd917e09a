"""Needle in a haystack: exact placement in real tokens, scoring, the grid table, bad input."""

import json
import math

import pytest
from model_fixtures import our_tokenizer

from longctx.evals.haystack import HaystackBuilder, natural_text
from longctx.evals.niah import NiahRunner, check_grid, run_grid
from longctx.evals.scoring import contains_answer
from longctx.evals.table import NiahTable


@pytest.fixture(scope="module")
def builder():
    return HaystackBuilder(our_tokenizer())


@pytest.mark.parametrize("haystack", ["passkey", "multikey"])
@pytest.mark.parametrize("length", [300, 777, 2048])
@pytest.mark.parametrize("depth", [0.0, 0.13, 0.5, 0.9, 1.0])
def test_prompt_has_the_exact_length_and_needle_depth(builder, haystack, length, depth):
    tok = our_tokenizer()
    p = builder.build(length, depth, seed=3, haystack=haystack)
    assert len(p.token_ids) == p.length == length
    assert p.depth_tokens == round(depth * p.haystack_len)
    needle = tok.decode(p.token_ids[p.needle_start : p.needle_start + p.needle_len])
    assert p.answer in needle and ("pass key" in needle or "magic number" in needle)
    assert tok.decode(p.answer_ids).strip() == p.answer
    before = tok.decode(p.token_ids[: p.needle_start])
    after = tok.decode(p.token_ids[p.needle_start + p.needle_len :])
    assert p.answer not in before + after  # the answer appears once, in the needle
    tail = tok.decode(p.token_ids[-40:], skip_special_tokens=False)
    assert "<|im_start|>assistant\n" in tail
    assert tail.endswith("The pass key is" if haystack == "passkey" else "mentioned in the provided text is")
    if haystack == "multikey":
        assert len(p.distractor_starts) == 3
        for s in p.distractor_starts:  # distractors never overlap the needle
            assert s + 5 <= p.needle_start or s >= p.needle_start + p.needle_len


def test_depth_zero_and_one_are_the_ends_of_the_haystack(builder):
    p0 = builder.build(1000, 0.0, 0, "passkey")
    p1 = builder.build(1000, 1.0, 0, "passkey")
    assert p0.needle_start == p0.haystack_start
    assert p1.needle_start + p1.needle_len == p1.haystack_start + p1.haystack_len + p1.needle_len
    assert p1.needle_start == p1.haystack_start + p1.haystack_len


def test_seeds_change_the_needle_and_prompts_are_deterministic(builder):
    a, b = builder.build(600, 0.5, 1, "multikey"), builder.build(600, 0.5, 1, "multikey")
    assert a.token_ids == b.token_ids
    assert builder.build(600, 0.5, 2, "multikey").answer != a.answer


def test_natural_text_is_local_prose():
    text = natural_text()
    assert len(text) > 50_000 and "http" not in text[:1000]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"length": 500, "depth": 1.5}, r"depth must be a number in \[0, 1\]"),
        ({"length": 500, "depth": -0.1}, r"depth must be a number in \[0, 1\]"),
        ({"length": 20, "depth": 0.5}, "too short"),
        ({"length": 500, "depth": 0.5, "haystack": "essay"}, "haystack must be one of"),
        ({"length": 0, "depth": 0.5}, "positive integer"),
    ],
)
def test_bad_prompt_input_is_a_clear_error(builder, kwargs, match):
    with pytest.raises(ValueError, match=match):
        builder.build(**kwargs)


def test_a_length_beyond_the_pool_is_refused_before_any_compute():
    runner = NiahRunner(None, our_tokenizer(), max_tokens=600)  # no model needed to refuse
    with pytest.raises(ValueError, match="pool holds 608"):
        runner.trial(1024, 0.5)
    with pytest.raises(ValueError, match="does not fit the runner's KV pool"):
        run_grid(runner, [512, 4096], [0.5], 1)
    with pytest.raises(ValueError, match=r"depths must be fractions in \[0, 1\]"):
        run_grid(runner, [512], [0.5, 2.0], 1)


def test_check_grid_normalises_and_validates():
    assert check_grid([512], [0, 1], 2) == ([512], [0.0, 1.0], [0, 1])
    with pytest.raises(ValueError, match="lengths"):
        check_grid([-5], [0.5], 1)
    with pytest.raises(ValueError, match="seed"):
        check_grid([100], [0.5], [])


def test_table_pivots_saves_and_loads(tmp_path):
    rows = [
        {"length": n, "depth": d, "seed": s, "correct": (n + s) % 3 != 0, "answer_logprob": -n / 1000 - d}
        for n in (512, 1024) for d in (0.0, 1.0) for s in (0, 1)
    ]  # fmt: skip
    t = NiahTable(rows, meta={"date": "2026-12-01"})
    lengths, depths, acc = t.pivot("correct")
    assert lengths == [512, 1024] and depths == [0.0, 1.0]
    assert acc[0, 0] == pytest.approx(0.5) and acc[1, 1] == pytest.approx(1.0)
    _, _, lp = t.pivot("answer_logprob")
    assert lp[1, 1] == pytest.approx(-2.024)
    path = t.save(tmp_path / "grid.json")
    back = NiahTable.load(path)
    assert back.rows == t.rows and back.meta == t.meta
    assert json.loads(path.read_text())["rows"][0] == rows[0]
    assert len(t.where(length=512)) == 4
    with pytest.raises(ValueError, match="no column"):
        t.pivot("accuracy")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a NIAH table"):
        NiahTable.load(tmp_path / "bad.json")


@pytest.mark.slow
def test_scores_are_consistent_with_greedy_decoding_and_the_full_logits(tmp_path):
    from model_fixtures import our_model

    from longctx.engine import generate
    from longctx.evals.perplexity import token_nll

    model, tok = our_model(), our_tokenizer()
    runner = NiahRunner(model, tok, max_tokens=1024)
    table = run_grid(runner, [400], [0.0, 1.0], 1, "passkey", progress=False)
    assert len(table) == 2 and all(r["length"] == 400 for r in table.rows)
    for row in table.rows:
        p = runner.builder.build(400, row["depth"], 0, "passkey")
        m = len(p.answer_ids)
        # the engine's own decoding
        greedy = generate(model, p.token_ids, m + 16, eos_token_id=tok.eos_token_id)
        assert row["exact"] == (greedy[:m] == p.answer_ids)
        text = tok.decode([t for t in greedy if t != tok.eos_token_id]).strip()
        assert text.startswith(row["output"]), "the recorded output is the start of the greedy answer"
        assert row["correct"] == contains_answer(text, p.answer)
        assert len(row["answer_token_logprobs"]) == m and len(row["forced_top"]) == m
        assert sum(row["answer_token_logprobs"]) == pytest.approx(row["answer_logprob"], abs=1e-6)
        nll = token_nll(model, p.token_ids + p.answer_ids, chunk_size=128)  # another path: chunked, all rows
        assert -sum(nll[-len(p.answer_ids) :]) == pytest.approx(row["answer_logprob"], abs=2e-3)
        assert math.isfinite(row["answer_logprob"]) and row["answer_logprob"] < 0
    path = table.save(tmp_path / "t.json")
    assert NiahTable.load(path).rows == table.rows


def test_heatmap_of_a_partial_grid_clips_its_colours():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from longctx.plots import plot_heatmap

    t = NiahTable([{"length": 512, "depth": 0.0, "answer_logprob": -0.5},
                   {"length": 512, "depth": 1.0, "answer_logprob": -20.0},
                   {"length": 1024, "depth": 0.0, "answer_logprob": -2.0}])
    lengths, depths, grid = t.pivot("answer_logprob")
    assert math.isnan(grid[1, 1])
    fig, ax = plt.subplots()
    out = plot_heatmap(grid, [str(n) for n in lengths], [str(d) for d in depths], ax=ax, log=False, vmin=-5)
    assert out is ax
    image = ax.images[0]
    assert image.norm.vmin == -5 and image.norm.vmax == -0.5
    assert [tx.get_text() for tx in ax.texts] == ["-0.5", "-20", "-2", "nan"]
    plt.close(fig)
    fig, ax = plt.subplots()
    plot_heatmap(grid, ["a", "b"], ["c", "d"], ax=ax, log=False, cell_text=[["1/2", "0/2"], ["2/2", ""]])
    assert [tx.get_text() for tx in ax.texts] == ["1/2", "0/2", "2/2", ""]
    with pytest.raises(ValueError, match="cell_text has shape"):
        plot_heatmap(grid, ["a", "b"], ["c", "d"], ax=ax, log=False, cell_text=[["1/2"]])
    plt.close(fig)


def test_question_start_is_where_the_question_begins(builder):
    p = builder.build(300, 0.5, 0, "passkey")
    assert 0 < p.question_start < p.length
    assert "pass key" in builder.tok.decode(p.token_ids[p.question_start:]).lower()
    assert p.question_start > p.needle_start + p.needle_len


@pytest.mark.slow
def test_pressed_trials_agree_with_the_engine_and_ratio_zero_changes_nothing():
    from model_fixtures import our_model

    from longctx.engine import Engine, MonolithicScheduler
    from longctx.engine.torch_executor import TorchExecutor
    from longctx.kv.block_manager import BlockManager
    from longctx.kv.press import make_press

    model, tok = our_model(), our_tokenizer()
    plain = NiahRunner(model, tok, max_tokens=512).trial(400, 0.5, 0, "passkey")
    zero = NiahRunner(model, tok, max_tokens=512, press=make_press("snapkv", 0.0)).trial(
        400, 0.5, 0, "passkey"
    )
    assert zero.correct == plain.correct and zero.answer_logprob == pytest.approx(
        plain.answer_logprob, abs=2e-3
    )
    assert zero.press == "snapkv 0" and plain.press == "none"
    for aware in (True, False):
        press = make_press("snapkv", 0.5)
        runner = NiahRunner(model, tok, max_tokens=512, press=press, question_aware=aware)
        trial = runner.trial(400, 0.5, 0, "passkey")
        assert trial.press == "snapkv 0.5" + ("" if aware else " agnostic")
        if not aware:
            continue
        p = runner.builder.build(400, 0.5, 0, "passkey")
        engine = Engine(TorchExecutor(model, BlockManager(40, 16), press=press), MonolithicScheduler())
        seq = engine.add_request(p.token_ids, len(p.answer_ids))
        engine.run_until_done()
        assert seq.num_evicted_tokens == 200
        assert trial.exact == (seq.output_token_ids == p.answer_ids)


def test_table_rates_give_n_and_a_wilson_interval_per_group():
    rows = [
        {"length": n, "depth": d, "correct": (i + n // 512) % 3 != 0}
        for n in (512, 1024)
        for d in (0.0, 1.0)
        for i in range(6)
    ]
    t = NiahTable(rows)
    by_length = t.rates("length")
    assert set(by_length) == {(512,), (1024,)} and by_length[(512,)].n == 12
    assert by_length[(512,)].k == sum(r["correct"] for r in rows if r["length"] == 512)
    lo, hi = by_length[(512,)].interval
    assert lo < by_length[(512,)].rate < hi
    cells = t.rates("length", "depth")
    assert len(cells) == 4 and all(r.n == 6 for r in cells.values())
    assert t.rates()[()].n == 24
    with pytest.raises(ValueError, match="no column"):
        t.rates("seed")
