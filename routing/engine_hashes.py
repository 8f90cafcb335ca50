"""A prompt's block hashes as the engine computes them, pure: the keys vLLM's prefix cache and its
KV events use, so the router can look a prompt up in what each engine reports holding
(routing/kv_index.py).

vLLM keys a full block of `block_size` token ids by a chained hash (vllm/v1/core/kv_cache_utils.py
`hash_block_tokens`): hash_i = H((hash_{i-1}, tuple(block_i_ids), extra_keys)), with hash_{-1} =
H("vllm-none-hash") for a cryptographic H when PYTHONHASHSEED is unset. Its events carry each
hash as the low 64 bits of the digest, big-endian (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, on by
default), which is what this returns.

H here is `sha256_cbor` (SHA-256 over canonical CBOR), not vLLM's default `sha256` (over a
pickle): CBOR is the same bytes in any process and Python version, so the door and the engine
cannot drift apart. Engines that publish KV events are started with
`--prefix-caching-hash-algo sha256_cbor` for that reason (deployments/replica).

Requests whose blocks carry extra keys (a LoRA adapter, images, a cache salt, prompt embeds)
hash differently; the caller routes those on load or on the approximate text hashes
(routing/prefix.py). Work is bounded by `max_blocks`, as prefix.py bounds the text it hashes.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

NONE_HASH_SEED = "vllm-none-hash"
HASH_ALGO = "sha256_cbor"
MAX_BLOCKS = 2048
_M64 = (1 << 64) - 1


def _sha256_cbor(obj: object) -> bytes:
    import cbor2

    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


@functools.cache
def _none_hash() -> bytes:
    return _sha256_cbor(NONE_HASH_SEED)


def engine_block_hashes(token_ids: Sequence[int], block_size: int, max_blocks: int = MAX_BLOCKS) -> tuple[int, ...]:
    """The 64-bit event hashes of the full blocks of `token_ids` (the partial last block is not
    cached, so it has none)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    parent, out = _none_hash(), []
    for i in range(min(len(token_ids) // block_size, max_blocks)):
        parent = _sha256_cbor((parent, tuple(token_ids[i * block_size:(i + 1) * block_size]), None))
        out.append(int.from_bytes(parent, "big") & _M64)
    return tuple(out)
