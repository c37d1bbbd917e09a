"""Block manager: slot mapping by hand, check-then-act, no leaks under random workloads (hypothesis)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.kv.block_manager import BlockManager, blocks_for_tokens, slots


def test_blocks_for_tokens():
    assert [blocks_for_tokens(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_allocate_grow_free_and_slots():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.allocate(7, 5) == [0, 1]  # 5 tokens -> 2 blocks
    assert bm.block_table(7) == [0, 1]
    assert [slots(bm.block_table(7), p, 4) for p in range(5)] == [0, 1, 2, 3, 4]
    assert bm.allocate(7, 6) == []  # a 6th token fits in block 1
    assert bm.allocate(8, 4) == [2]
    assert bm.num_free_blocks == 1
    assert bm.allocate(7, 8) == []  # 7, 8 tokens
    assert bm.allocate(7, 9) == [3]  # a 9th token needs a new block
    assert [slots(bm.block_table(7), p, 4) for p in (6, 7, 8)] == [6, 7, 12]
    assert not bm.can_allocate(8, 5) and not bm.can_allocate(9, 1) and bm.can_allocate(8, 4)
    with pytest.raises(ValueError, match="only 0 of 4 are free"):
        bm.allocate(9, 1)
    assert bm.num_free_blocks == 0 and bm.block_table(9) == []  # a failed allocate changes nothing
    assert bm.free(7) == 3 and bm.free(7) == 0
    bm.check_invariants()
    assert bm.can_allocate(9, 12)


def test_slots_is_one_formula_for_lists_and_tensors():
    torch = pytest.importorskip("torch")
    table = [5, 2, 9]
    expected = [slots(table, p, 4) for p in range(12)]
    assert expected[:5] == [20, 21, 22, 23, 8]
    assert slots(torch.tensor(table), torch.arange(12), 4).tolist() == expected


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, block_size=0)
    with pytest.raises(ValueError, match="num_tokens"):
        BlockManager(4).can_allocate(1, -1)


ops = st.lists(
    st.tuples(st.sampled_from(["grow", "grow1", "free"]), st.integers(0, 5), st.integers(1, 40)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 2, 4, 16]), ops=ops)
def test_random_workload_never_leaks(num_blocks, block_size, ops):
    bm = BlockManager(num_blocks, block_size)
    tokens: dict[int, int] = {}  # what each sequence holds (the caller's count, as Sequence keeps it)
    for op, sid, n in ops:
        if op in ("grow", "grow1"):
            total = tokens.get(sid, 0) + (n if op == "grow" else 1)
            if bm.can_allocate(sid, total):
                new = bm.allocate(sid, total)
                assert len(new) == blocks_for_tokens(total, block_size) - blocks_for_tokens(
                    tokens.get(sid, 0), block_size)
                tokens[sid] = total
            else:
                with pytest.raises(ValueError):
                    bm.allocate(sid, total)
        else:
            bm.free(sid)
            tokens.pop(sid, None)
        bm.check_invariants()
        for s, n_tok in tokens.items():
            assert len(bm.block_table(s)) == blocks_for_tokens(n_tok, block_size)
            assert len({slots(bm.block_table(s), p, block_size) for p in range(n_tok)}) == n_tok
    all_slots = [slots(bm.block_table(s), p, block_size) for s, n_tok in tokens.items() for p in range(n_tok)]
    assert len(all_slots) == len(set(all_slots))  # no two sequences share a slot
    for s in list(tokens):
        bm.free(s)
    assert bm.num_free_blocks == num_blocks
