"""The engine's usage read on the way through the door (deployments/ingress/usage_tap.py): the usage chunk
the door asked for is taken out of the stream wherever the chunks split, a client that asked
keeps it, and the body the door sends asks for it in a form vLLM reads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hbmserve.deployments.ingress.request_body import read_generation
from hbmserve.deployments.ingress.usage_tap import Usage, UsageTap, with_usage_asked

CHAT = "/v1/chat/completions"
EVENTS = [{"choices": [{"index": 0, "delta": {"content": w}}]} for w in ("the", " usage", "\"usage\":")]
USAGE = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                                  "prompt_tokens_details": {"cached_tokens": 0}}}
STREAM = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in [*EVENTS, USAGE]) + b"data: [DONE]\n\n"


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, *(c % (len(data) + 1) for c in cuts), len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


@given(st.lists(st.integers(0, 10_000), max_size=8))
def test_the_usage_chunk_is_stripped_wherever_the_stream_splits(cuts):
    tap = UsageTap(strip=True)
    tap.begin(200, streamed=True)
    out = b"".join(tap.feed(c) for c in _split(STREAM, cuts)) + tap.finish()
    assert tap.usage == Usage(7, 3)
    events = [e for e in out.split(b"\n\n") if e]
    assert [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]] == EVENTS  # content quoting "usage" kept
    assert events[-1] == b"data: [DONE]"


@given(st.lists(st.integers(0, 10_000), max_size=8))
def test_a_client_that_asked_for_usage_gets_the_stream_untouched(cuts):
    tap = UsageTap(strip=False)
    tap.begin(200, streamed=True)
    assert b"".join(tap.feed(c) for c in _split(STREAM, cuts)) + tap.finish() == STREAM
    assert tap.usage == Usage(7, 3)


def test_a_whole_reply_is_read_at_its_end():
    body = json.dumps({"choices": [{"text": "x" * 5000}], "usage": USAGE["usage"]}).encode()
    tap = UsageTap(strip=True)
    tap.begin(200, streamed=False)
    assert b"".join(tap.feed(c) for c in _split(body, [100, 4000, 5050])) + tap.finish() == body
    assert tap.spent(charged=4096, prompt_tokens=7) == 10


def test_what_a_request_costs_without_a_usage():
    tap = UsageTap(strip=True)
    assert tap.spent(charged=500, prompt_tokens=20) == 0  # never reached a replica (refused, left the queue)
    tap.forwarded = True
    assert tap.spent(500, 20) == 20  # the client left before any reply: the prompt may have run
    tap.begin(400, streamed=False)
    assert tap.spent(500, 20) == 0  # the engine refused it
    tap.begin(200, streamed=True)
    tap.feed(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in EVENTS))
    assert tap.spent(500, 20) == 20 + 2  # three events, the last counted as the end marker
    tap = UsageTap(strip=False)
    tap.forwarded = True
    tap.begin(200, streamed=False)
    tap.feed(b'{"choices": []}')
    tap.finish()
    assert tap.spent(500, 20) == 500  # a whole reply without usage keeps its charge


@pytest.mark.parametrize("body", [
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": None},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
     "stream_options": {"continuous_usage_stats": True}},
])
def test_the_body_sent_asks_vllm_for_the_usage_chunk_alone(body):
    raw = json.dumps(body).encode()
    sent = with_usage_asked(raw, body, read_generation(CHAT, body))
    protocol = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol",
                                   reason="vLLM is the reference (pip install 'hbmserve[cpu]')")
    r = protocol.ChatCompletionRequest.model_validate_json(sent)
    assert r.stream_options.include_usage and not r.stream_options.continuous_usage_stats
    assert r.messages == protocol.ChatCompletionRequest.model_validate(body).messages


def test_a_body_that_needs_nothing_is_sent_as_it_came():
    for body in ({"model": "m", "messages": [], "stream": False},
                 {"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True}}):
        raw = json.dumps(body).encode()
        assert with_usage_asked(raw, body, read_generation(CHAT, body)) is raw
