"""A prompt's prefix as block hashes: the key `choose` uses for prefix affinity, pure.

The live ingress has no tokenizer, so it cuts the prompt TEXT into fixed blocks of
`block_chars` characters and hashes each prefix: hash i covers blocks 0..i, so two prompts
share hash i exactly when their first i+1 blocks are equal (a chained hash, as vLLM keys its
KV blocks). The partial last block is left out, as vLLM caches only full blocks.

`DEFAULT_BLOCK_CHARS` = 64: English text runs about 4 characters per BPE token (the simulated
engine's own estimate, deployments/replica/sim_protocol.py), so one block is about one vLLM KV block of
16 tokens. The blocks need not line up with the engine's: they only have to agree between
requests, and a shared prefix of n characters yields about n / 64 shared hashes at any
alignment.

Work per request is bounded: only the first `MAX_HASHED_CHARS` characters are hashed (512
hashes, well under a millisecond), so a megabyte prompt costs no more than a 32 k one. Two
prompts equal in their first 32 k characters look alike to the router; beyond that length the
shared prefix is worth a cache hit anyway.

Hashes are blake2b (8 bytes, masked to 63 bits so they fit a signed int64 in JSON, numpy or a
database), not Python's `hash()`, which is salted per process: the ingress, the replicas and
the simulator must all agree.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, KeysView, Mapping, Sequence
from typing import Any

DEFAULT_BLOCK_CHARS = 64
MAX_HASHED_CHARS = 32_768
_MASK63 = (1 << 63) - 1


def prompt_block_hashes(text: str, block_chars: int = DEFAULT_BLOCK_CHARS,
                        max_chars: int = MAX_HASHED_CHARS) -> tuple[int, ...]:
    """Chained hashes of the full `block_chars`-character blocks of `text[:max_chars]`."""
    if block_chars < 1:
        raise ValueError(f"block_chars must be >= 1, got {block_chars}")
    n = min(len(text), max_chars) // block_chars
    running = hashlib.blake2b(digest_size=8)
    out = []
    for i in range(n):
        # One running digest over the whole prefix: copying it per block keeps the chain O(length).
        running.update(text[i * block_chars:(i + 1) * block_chars].encode("utf-8", "surrogatepass"))
        out.append(int.from_bytes(running.copy().digest(), "little") & _MASK63)
    return tuple(out)


def request_text(path: str, body: Mapping[str, Any], first_of_many: bool = False) -> str | None:
    """The text an OpenAI request's prefix hashes are taken from: its chat messages rendered by
    `chat_prompt_text`, or its completion prompt (a list of one prompt counts; with
    `first_of_many`, the first of several). None where it has no text prompt (token ids, none)."""
    if path == "/v1/chat/completions":
        messages = body.get("messages")
        return chat_prompt_text(messages) if isinstance(messages, list) else None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and (len(prompt) == 1 or first_of_many):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def chat_prompt_text(messages: Iterable[Mapping[str, Any]], max_chars: int = MAX_HASHED_CHARS) -> str:
    """OpenAI chat messages as one string, `<|role|>\\ncontent\\n` per message (the framing
    sim_protocol.py counts tokens with), stopping once `max_chars` are rendered.

    Role markers are part of the text, so the same system prompt gives the same leading blocks
    in every request, and a user turn never matches an assistant turn of the same words.
    Content may be a string, a list of parts ({type: text, text}; other parts, such as images,
    render as their JSON so different images do not look alike), or absent."""
    out: list[str] = []
    size = 0
    for m in messages:
        piece = f"<|{m.get('role', '')}|>\n{_content_text(m.get('content'))}\n"
        out.append(piece)
        size += len(piece)
        if size >= max_chars:
            break
    return "".join(out)[:max_chars]


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, Mapping) and p.get("type") == "text"
                       else json.dumps(p, sort_keys=True, default=str) for p in content)
    return json.dumps(content, sort_keys=True, default=str)


class RecentPrefixes:
    """The approximate picture of one replica's prefix cache: the last `capacity` block hashes
    routed to it, most recent kept. What the router falls back to when the engines publish no
    KV events; blind to evictions, restarts and other front doors' traffic."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lru: OrderedDict[int, None] = OrderedDict()

    def remember(self, hashes: Sequence[int]) -> None:
        # Last first, so a prefix's head is the newest and goes last: the set stays
        # prefix-closed, which choose's binary search relies on.
        for h in reversed(hashes):
            self._lru[h] = None
            self._lru.move_to_end(h)
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)

    def keys(self) -> KeysView[int]:
        return self._lru.keys()

    def __len__(self) -> int:
        return len(self._lru)
