"""Prompt block hashes (routing/prefix.py): chained, stable, bounded; chat messages rendered so
a shared system prompt gives shared leading blocks."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from hbmserve.routing.prefix import DEFAULT_BLOCK_CHARS, MAX_HASHED_CHARS, chat_prompt_text, prompt_block_hashes

SYSTEM = "You are a careful assistant for the billing team. " * 40  # 2,000 characters


def test_one_hash_per_full_block_and_the_first_is_blake2b_of_the_first_block():
    text = "x" * (3 * DEFAULT_BLOCK_CHARS + 10)
    hs = prompt_block_hashes(text)
    assert len(hs) == 3  # the partial last block is left out
    first = int.from_bytes(hashlib.blake2b(text[:64].encode(), digest_size=8).digest(), "little") & ((1 << 63) - 1)
    assert hs[0] == first
    assert prompt_block_hashes("short") == ()
    assert all(0 <= h < 2**63 for h in hs)


def test_hash_i_covers_blocks_0_to_i_not_block_i_alone():
    a = prompt_block_hashes("A" * 64 + "B" * 64)
    b = prompt_block_hashes("C" * 64 + "B" * 64)
    assert a[1] != b[1]  # same second block, different first: different prefix


@given(st.text(min_size=0, max_size=600), st.text(min_size=0, max_size=300), st.text(min_size=0, max_size=300),
       st.integers(1, 80))
def test_equal_leading_hashes_exactly_where_the_texts_share_whole_blocks(common, x, y, block):
    a, b = common + x, common + y
    ha, hb = prompt_block_hashes(a, block), prompt_block_hashes(b, block)
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    same = sum(1 for i in range(min(len(ha), len(hb))) if ha[i] == hb[i])
    # Equal exactly for the blocks wholly inside the shared text (a blake2b collision aside).
    assert same == min(shared // block, len(ha), len(hb))
    assert ha[:same] == hb[:same]


def test_work_is_capped_at_max_hashed_chars():
    big = "y" * (10 * MAX_HASHED_CHARS)
    assert len(prompt_block_hashes(big)) == MAX_HASHED_CHARS // DEFAULT_BLOCK_CHARS
    assert prompt_block_hashes(big) == prompt_block_hashes(big[:MAX_HASHED_CHARS] + "different tail")


def test_chats_sharing_a_system_prompt_share_its_blocks_and_no_more():
    def chat(user):
        return chat_prompt_text([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
    a, b = prompt_block_hashes(chat("What is my balance? " * 10)), prompt_block_hashes(chat("Close my account. " * 10))
    rendered_system = len(f"<|system|>\n{SYSTEM}\n")
    same = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert same == (rendered_system + len("<|user|>\n")) // DEFAULT_BLOCK_CHARS


def test_a_later_turn_extends_the_earlier_turn_s_hashes():
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello " * 30}]
    turn2 = turn1 + [{"role": "assistant", "content": "hi " * 50}, {"role": "user", "content": "more"}]
    h1, h2 = prompt_block_hashes(chat_prompt_text(turn1)), prompt_block_hashes(chat_prompt_text(turn2))
    assert h2[:len(h1)] == h1 and len(h2) > len(h1)


def test_message_rendering_is_deterministic_and_distinguishes_roles_and_parts():
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]
    assert chat_prompt_text([{"role": "user", "content": parts}]) == chat_prompt_text([{"role": "user", "content": "Hello there"}])
    assert chat_prompt_text([{"role": "user", "content": "x"}]) != chat_prompt_text([{"role": "assistant", "content": "x"}])
    img = lambda url: [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]  # noqa: E731
    assert chat_prompt_text(img("a.png")) != chat_prompt_text(img("b.png"))
    assert chat_prompt_text([{"role": "assistant", "content": None}]) == "<|assistant|>\n\n"


def test_rendering_stops_at_max_chars():
    many = [{"role": "user", "content": "z" * 1000}] * 1000
    assert len(chat_prompt_text(many, max_chars=5000)) == 5000
