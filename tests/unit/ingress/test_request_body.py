"""The door reads a generation body as vLLM does (ingress/request_body.py): on the hostile
bodies of the hardening issue, the door's models accept and refuse what vLLM's own request
models accept and refuse, and read the same max tokens, n and prompts."""

from __future__ import annotations

import pytest

from hbmserve.ingress.request_body import (COMPLETION_DEFAULT_MAX_TOKENS, BodyShapeError, Generation,
                                           read_generation)

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
]


def _vllm(path: str, body: dict):
    """What vLLM's own request model makes of the body: (max tokens the engine runs, n, prompts),
    or None when it refuses it."""
    protocol = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol",
                                   reason="vLLM is the reference (pip install 'hbmserve[cpu]')")
    from pydantic import ValidationError
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    try:
        if path == CHAT:
            r = protocol.ChatCompletionRequest.model_validate({"model": "m", **body})
            asked = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
            return asked, r.n if r.n is not None else 1, 1
        r = CompletionRequest.model_validate({"model": "m", **body})
        prompts = 1 if isinstance(r.prompt, str) or not r.prompt or isinstance(r.prompt[0], int) else len(r.prompt)
        return r.max_tokens, r.n, prompts
    except (ValidationError, ValueError):
        return None


def _door(path: str, body: dict):
    try:
        g = read_generation(path, body)
    except BodyShapeError:
        return None
    return g.max_tokens, g.sequences // g.prompts, g.prompts


@pytest.mark.parametrize(("path", "body"), [(CHAT, b) for b in CHAT_BODIES] + [(COMPLETIONS, b) for b in COMPLETION_BODIES])
def test_the_door_reads_a_body_as_vllm_does(path, body):
    assert _door(path, body) == _vllm(path, body)


def test_what_is_charged_is_what_runs():
    assert read_generation(CHAT, {"messages": HI, "max_tokens": 12000, "max_completion_tokens": 1}).max_tokens == 1
    ids = read_generation(COMPLETIONS, {"prompt": list(range(30_000)), "max_tokens": 1})
    assert ids == Generation(prompts=1, sequences=1, prompt_tokens=30_000, max_tokens=1)
    two = read_generation(COMPLETIONS, {"prompt": ["a" * 400, "b"], "n": 2})
    assert (two.prompts, two.sequences, two.prompt_tokens, two.max_tokens) == (2, 4, 100, COMPLETION_DEFAULT_MAX_TOKENS)
    long_chat = read_generation(CHAT, {"messages": [{"role": "user", "content": "x" * 120_000}]})
    assert long_chat.prompt_tokens == 30_001 and long_chat.max_tokens is None  # the whole text; to the end


@pytest.mark.parametrize(("body", "param"), [({"messages": [1, 2, 3]}, "messages.0"),
                                             ({"messages": HI, "n": 0}, "n"),
                                             ({"messages": HI, "max_tokens": -5}, "max_tokens")])
def test_a_wrong_shape_names_the_field(body, param):
    with pytest.raises(BodyShapeError) as err:
        read_generation(CHAT, body)
    assert err.value.param == param and str(err.value).startswith(param)
