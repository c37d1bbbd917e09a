"""Block manager: slot mapping by hand, check-then-act, no leaks under random workloads (hypothesis)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.kv.block_manager import BlockManager, blocks_for_tokens


def test_blocks_for_tokens():
    assert [blocks_for_tokens(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_allocate_append_free_and_slot_mapping():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.allocate(7, 5) == [0, 1]  # 5 tokens -> 2 blocks
    assert bm.block_table(7) == [0, 1]
    assert bm.slot_mapping(7, 0, 5) == [0, 1, 2, 3, 4]
    assert bm.append(7) == []  # 6th token fits in block 1
    assert bm.allocate(8, 4) == [2]
    assert bm.num_free_blocks == 1
    assert bm.append(7) == [] and bm.append(7) == []  # 7, 8 tokens
    assert bm.append(7) == [3]  # 9th token needs a new block
    assert bm.slot_mapping(7, 6, 9) == [6, 7, 12]
    assert not bm.can_allocate(8, 1) and not bm.can_allocate(9, 1)
    with pytest.raises(ValueError, match="only 0 of 4 are free"):
        bm.allocate(9, 1)
    assert bm.num_free_blocks == 0 and not bm.has(9)  # a failed allocate changes nothing
    assert bm.free(7) == 3 and bm.free(7) == 0
    bm.check_invariants()
    assert bm.can_allocate(9, 12)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, block_size=0)
    bm = BlockManager(4)
    with pytest.raises(ValueError, match="allocate its prompt first"):
        bm.append(1)
    bm.allocate(1, 3)
    with pytest.raises(ValueError, match="outside"):
        bm.slot_mapping(1, 0, 4)


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "append", "free"]), st.integers(0, 5), st.integers(1, 40)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 2, 4, 16]), ops=ops)
def test_random_workload_never_leaks(num_blocks, block_size, ops):
    bm = BlockManager(num_blocks, block_size)
    tokens: dict[int, int] = {}
    for op, sid, n in ops:
        if op == "alloc":
            ok = bm.can_allocate(sid, n)
            if ok:
                bm.allocate(sid, n)
                tokens[sid] = tokens.get(sid, 0) + n
            else:
                with pytest.raises(ValueError):
                    bm.allocate(sid, n)
        elif op == "append" and sid in tokens:
            if bm.can_allocate(sid, 1):
                bm.append(sid)
                tokens[sid] += 1
        elif op == "free":
            bm.free(sid)
            tokens.pop(sid, None)
        bm.check_invariants()
        for s, n_tok in tokens.items():
            assert bm.num_tokens(s) == n_tok
            slots = bm.slot_mapping(s, 0, n_tok)
            assert len(set(slots)) == n_tok
    all_slots = [x for s, n_tok in tokens.items() for x in bm.slot_mapping(s, 0, n_tok)]
    assert len(all_slots) == len(set(all_slots))  # no two sequences share a slot
    for s in list(tokens):
        bm.free(s)
    assert bm.num_free_blocks == num_blocks
