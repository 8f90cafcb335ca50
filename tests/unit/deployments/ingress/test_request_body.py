"""The door reads a generation body as vLLM does (deployments/ingress/request_body.py): on the hostile
bodies of the hardening issue, the door's models accept and refuse what vLLM's own request
models accept and refuse, and read the same max tokens, n and prompts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.deployments.ingress.request_body import (COMPLETION_DEFAULT_MAX_TOKENS, BodyShapeError, Generation,
                                           read_generation)
from tests.unit.deployments.ingress.content_parts import PARTS, well_formed

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "hi"}]

CHAT_BODIES = [
    {"messages": HI, "max_tokens": 12000},
    {"messages": HI, "max_tokens": 12000, "max_completion_tokens": 1},  # the engine runs 1
    {"messages": HI, "max_tokens": "12000"},  # a string number
    {"messages": HI, "max_tokens": 12000.0},
    {"messages": HI, "max_tokens": 12.5},
    {"messages": HI, "n": 4.0},
    {"messages": HI, "n": "4"},
    {"messages": HI, "n": 4.5},
    {"messages": HI},  # no max_tokens: to the end of the context
    {"messages": [1, 2, 3]},
    {"messages": "hello"},
    {"messages": [{"content": "no role"}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "part"}]}]},
    {"messages": HI, "stream": True, "stream_options": {"include_usage": True}},
    {"messages": HI, "stream": "true", "stream_options": {"include_usage": "yes"}},
    {"messages": HI, "stream_options": {"include_usage": True}},  # options without a stream: refused
    {"messages": HI, "stream": True, "stream_options": {"include_usage": [1]}},
]
COMPLETION_BODIES = [
    {"prompt": "hi", "max_tokens": 5},
    {"prompt": list(range(30_000)), "max_tokens": 1},  # token ids
    {"prompt": ["a" * 400, "b"], "max_tokens": 3},  # two prompts: two sequences each n
    {"prompt": [[1, 2, 3], [4]], "n": 2},
    {"prompt": [-1, 2]},
    {"prompt": "hi", "max_tokens": None},  # vLLM's default, 16
    {"prompt": "hi", "n": "3"},
    {"prompt": {"text": "hi"}},
    {"prompt": "hi", "stream": 1, "stream_options": {"include_usage": 0}},
    {"prompt": "hi", "stream": False, "stream_options": {"include_usage": True}},
    {"prompt": "hi", "stream": "false", "stream_options": {"include_usage": True}},  # vLLM checks the raw value
]
EMBEDDING_BODIES = [
    {"input": "hi"},
    {"input": ["a" * 40, "b", "c"]},
    {"input": [[1, 2], [3]]},
    {"input": [1, 2, 3]},
    {"input": [-1]},
    {"input": {"text": "hi"}},
    {},
]
EMBEDDINGS = "/v1/embeddings"


def _vllm(path: str, body: dict):
    """What vLLM's own request model makes of the body: (max tokens the engine runs, n, prompts),
    or None when it refuses it."""
    protocol = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol",
                                   reason="vLLM is the reference (pip install 'hbmserve[cpu]')")
    from pydantic import ValidationError
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
    from vllm.exceptions import VLLMValidationError

    def count(prompt) -> int:
        return 1 if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int) else len(prompt)

    def usage(r) -> bool:
        return bool(r.stream and r.stream_options and r.stream_options.include_usage)

    try:
        if path == CHAT:
            r = protocol.ChatCompletionRequest.model_validate({"model": "m", **body})
            asked = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
            return asked, r.n if r.n is not None else 1, 1, bool(r.stream), usage(r)
        if path == EMBEDDINGS:
            r = EmbeddingCompletionRequest.model_validate({"model": "m", **body})
            return 0, 1, count(r.input), False, False
        r = CompletionRequest.model_validate({"model": "m", **body})
        return r.max_tokens, r.n, count(r.prompt), bool(r.stream), usage(r)
    except (ValidationError, ValueError, VLLMValidationError):
        return None


def _door(path: str, body: dict):
    try:
        g = read_generation(path, body)
    except BodyShapeError:
        return None
    return g.max_tokens, g.sequences // g.prompts, g.prompts, g.stream, g.stream_usage


@pytest.mark.parametrize(("path", "body"), [(CHAT, b) for b in CHAT_BODIES] + [(COMPLETIONS, b) for b in COMPLETION_BODIES]
                         + [(EMBEDDINGS, b) for b in EMBEDDING_BODIES])
def test_the_door_reads_a_body_as_vllm_does(path, body):
    assert _door(path, body) == _vllm(path, body)


def test_what_is_charged_is_what_runs():
    assert read_generation(CHAT, {"messages": HI, "max_tokens": 12000, "max_completion_tokens": 1}).max_tokens == 1
    ids = read_generation(COMPLETIONS, {"prompt": list(range(30_000)), "max_tokens": 1})
    assert ids == Generation(prompts=1, sequences=1, prompt_tokens=30_000, max_tokens=1, all_prompt_tokens=30_000)
    assert ids.most_tokens(max_model_len=32_768) == 30_001
    two = read_generation(COMPLETIONS, {"prompt": ["a" * 400, "b"], "n": 2})
    assert (two.prompts, two.sequences, two.prompt_tokens, two.max_tokens) == (2, 4, 100, COMPLETION_DEFAULT_MAX_TOKENS)
    assert two.most_tokens(4096) == 100 + 0 + 4 * COMPLETION_DEFAULT_MAX_TOKENS  # every prompt, every sequence
    long_chat = read_generation(CHAT, {"messages": [{"role": "user", "content": "x" * 120_000}]})
    assert long_chat.prompt_tokens == 30_001 and long_chat.max_tokens is None  # the whole text; to the end
    # Without max_tokens, chat runs to the end of the context: that is what is charged.
    short = read_generation(CHAT, {"messages": HI, "n": 2})
    assert short.most_tokens(max_model_len=2048) == 1 + 2 * (2048 - 1)
    batch = read_generation(EMBEDDINGS, {"input": ["a" * 40, "b" * 8]})
    assert (batch.sequences, batch.all_prompt_tokens, batch.most_tokens(2048)) == (2, 12, 12)
    streamed = read_generation(COMPLETIONS, {"prompt": "hi", "stream": True})
    assert streamed.stream and not streamed.stream_usage


@pytest.mark.parametrize(("body", "param"), [({"messages": [1, 2, 3]}, "messages.0"),
                                             ({"messages": HI, "n": 0}, "n"),
                                             ({"messages": HI, "max_tokens": -5}, "max_tokens")])
def test_a_wrong_shape_names_the_field(body, param):
    with pytest.raises(BodyShapeError) as err:
        read_generation(CHAT, body)
    assert err.value.param == param and str(err.value).startswith(param)


@pytest.mark.parametrize(("part", "param"), [
    ({"type": "text", "text": 5}, "messages.0.content.0.text"),  # was a 500 with a plain-text body
    ({"type": "text"}, "messages.0.content.0.text"),
    ({"type": "image_url", "image_url": {"url": 5}}, "messages.0.content.0.image_url.url"),
    ({"type": "input_audio", "input_audio": {"data": "x", "format": 5}}, "messages.0.content.0.input_audio.format"),
    ({"type": "refusal", "refusal": [1]}, "messages.0.content.0.refusal"),
    ({"type": 5}, "messages.0.content.0.type"),
    ({"type": {"a": 1}}, "messages.0.content.0.type"),
    (7, "messages.0.content.0"),
])
def test_a_wrong_content_part_names_its_field(part, param):
    with pytest.raises(BodyShapeError) as err:
        read_generation(CHAT, {"messages": [{"role": "user", "content": ["ok", part]}]})
    assert err.value.param == param.replace("content.0", "content.1")
    assert "instance of" not in str(err.value)  # no class names of ours


@given(parts=st.lists(PARTS, min_size=1, max_size=3))
@settings(max_examples=300, deadline=None)
def test_every_content_part_is_read_or_refused_by_name(parts):
    """Accepted exactly when every part is well formed (derived from OpenAI's types); otherwise a
    BodyShapeError naming the first bad part; never another exception."""
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 4}
    if all(well_formed(p) for p in parts):
        text = "".join(p if isinstance(p, str) else p["text"] for p in parts
                       if isinstance(p, str) or p.get("type") == "text")
        assert read_generation(CHAT, body).prompt_tokens == (len("user") + len(text)) // 4
    else:
        with pytest.raises(BodyShapeError) as err:
            read_generation(CHAT, body)
        bad = next(i for i, p in enumerate(parts) if not well_formed(p))
        assert err.value.param.startswith(f"messages.0.content.{bad}")
