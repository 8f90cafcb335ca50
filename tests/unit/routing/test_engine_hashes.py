"""The door's block hashes equal vLLM's own, computed by vLLM's functions (not a copy of them)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.routing.engine_hashes import HASH_ALGO, engine_block_hashes

pytest.importorskip("vllm", reason="vllm is not installed (pip install -e '.[cpu]')")


def _vllm_hashes(ids: list[int], block_size: int) -> list[int]:
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kv

    fn = get_hash_fn_by_name(HASH_ALGO)
    kv.init_none_hash(fn)
    parent, out = None, []
    for i in range(len(ids) // block_size):
        parent = kv.hash_block_tokens(fn, parent, ids[i * block_size:(i + 1) * block_size], None)
        out.append(kv.maybe_convert_block_hash(parent))
    return out


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(st.integers(0, 200_000), max_size=80), block_size=st.sampled_from([1, 4, 16]))
def test_the_hashes_equal_vllms_for_any_token_ids(ids, block_size):
    assert list(engine_block_hashes(ids, block_size)) == _vllm_hashes(ids, block_size)


def test_a_shared_prefix_shares_its_leading_hashes_and_the_partial_block_has_none():
    a = engine_block_hashes(list(range(40)), 16)
    b = engine_block_hashes([*range(32), 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7], 16)
    assert len(a) == 2 and a == b[:2] and len(b) == 3
    assert engine_block_hashes(list(range(40)), 16, max_blocks=1) == a[:1]
    with pytest.raises(ValueError, match="block_size"):
        engine_block_hashes([1], 0)
