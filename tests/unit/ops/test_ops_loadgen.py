"""`hbmserve bench`'s load generator, without a network: URLs, prompts, the completeness check,
the open and closed loops' timing (on an in-memory client), the vLLM loader and the plot's
series (ops/loadgen.py, ops/bench_clients.py, ops/bench_plot.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.capacity.traces.arrivals import Arrivals, length_stream
from hbmserve.ops.bench_clients import (Ask, EndpointError, Endpoint, Reply, completions_url, load_vllm_request_func,
                                        open_client)
from hbmserve.ops.bench_figures import RequestRecord
from hbmserve.ops.bench_plot import Timings
from hbmserve.ops.loadgen import TOKEN_ID_HIGH, TOKEN_ID_LOW, LoadSpec, arrivals_of, closed_loop, open_loop, \
    prompt_for, record_of


@pytest.mark.parametrize("url, expected", [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1/completions"),
    ("http://h:8000/", "http://h:8000/v1/completions"),
    ("https://api.example.com/v1", "https://api.example.com/v1/completions"),
    ("http://h/proxy/v1/completions", "http://h/proxy/v1/completions"),
])
def test_the_url_names_the_completions_endpoint(url, expected):
    assert completions_url(url) == expected


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://h", "http://", "http://h:port"])
def test_a_malformed_url_is_refused_naming_the_flag(url):
    with pytest.raises(EndpointError, match="--url"):
        completions_url(url)


def test_the_api_key_is_sent_but_never_shown():
    ep = Endpoint("http://h/v1/completions", "m", "sk-secret", {"X-Tenant": "a"})
    assert ep.auth_headers() == {"Authorization": "Bearer sk-secret", "X-Tenant": "a"}
    assert "sk-secret" not in repr(ep)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 4000), st.integers(0, 10))
def test_token_prompts_are_exactly_as_long_as_asked_and_valid_ids(index, tokens, seed):
    ids = prompt_for(index, tokens, "tokens", seed)
    assert len(ids) == tokens and all(TOKEN_ID_LOW <= i < TOKEN_ID_HIGH for i in ids)
    assert ids == prompt_for(index, tokens, "tokens", seed)  # seeded


def test_prompts_differ_from_the_first_token_so_no_prefix_is_shared():
    firsts = {tuple(prompt_for(i, 64, "tokens")[:16]) for i in range(50)}
    assert len(firsts) == 50
    text = prompt_for(7, 20, "text")
    assert text.startswith("#7 ") and len(text.split()) == 20


def ask(max_tokens: int = 10, ignore_eos: bool = True) -> Ask:
    return Ask(3, [1, 2], 2, max_tokens, ignore_eos)


def test_a_reply_short_of_its_exact_length_is_a_stream_error():
    whole = Reply(0.1, 1.0, (0.1,) * 9, usage_tokens=None)
    assert record_of(ask(), whole, 5.0).ok and record_of(ask(), whole, 5.0).output_tokens == 10
    short = Reply(0.1, 0.5, (0.1,) * 3)  # 4 chunks, no usage: the stream broke
    rec = record_of(ask(), short, 5.0)
    assert rec.error_kind == "stream" and "4 of 10" in rec.error
    assert record_of(ask(ignore_eos=False), short, 5.0).ok  # a model may stop early when allowed
    batched = Reply(0.1, 1.0, (0.3,) * 2, usage_tokens=10)  # 3 chunks of several tokens: usage counts
    assert record_of(ask(), batched, 5.0).output_tokens == 10
    failed = record_of(ask(), Reply(error_kind="429", error="slow down"), 5.0, scheduled_s=4.9)
    assert (failed.error_kind, failed.ttft_s, failed.scheduled_s) == ("429", None, 4.9)


def test_the_simulator_gets_the_requests_in_send_order_with_generated_lengths():
    recs = [RequestRecord(1, 0.5, 30, 8, 0.1, 0.2, (), 8), RequestRecord(0, 0.1, 20, 9, error_kind="503"),
            RequestRecord(2, 0.3, 40, 7, 0.1, 0.2, (), 5)]
    arr = arrivals_of(recs)
    assert arr.t.tolist() == [0.1, 0.3, 0.5]
    assert arr.prompt.tolist() == [20, 40, 30] and arr.output.tolist() == [9, 5, 8]


def test_length_stream_is_seeded_and_exact_without_spread():
    a = [next(s) for s in [length_stream(100, 20, 0.5, seed=3)] for _ in range(5)]
    b = [next(s) for s in [length_stream(100, 20, 0.5, seed=3)] for _ in range(5)]
    assert a == b
    fixed = length_stream(100, 20)
    assert [next(fixed) for _ in range(3)] == [(100, 20)] * 3


class InstantClient:
    """Replies after `delay_s` with a whole reply; records how many requests overlap."""

    name, note = "fake", "in memory"

    def __init__(self, delay_s: float = 0.0):
        self.delay_s, self.in_flight, self.peak = delay_s, 0, 0

    async def send(self, a: Ask) -> Reply:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        return Reply(0.001, 0.002, (0.001,) * (a.max_tokens - 1))

    async def aclose(self) -> None:
        pass


def test_the_open_loop_sends_each_request_when_due_whatever_the_replies():
    times = np.array([0.0, 0.05, 0.1, 0.3])
    arr = Arrivals(times, np.full(4, 8), np.full(4, 4))
    client = InstantClient(delay_s=0.5)  # slower than the gaps: an open loop does not wait
    records = asyncio.run(open_loop(client, arr, LoadSpec()))
    assert [r.index for r in records] == [0, 1, 2, 3] and all(r.ok for r in records)
    sent = np.array([r.sent_s for r in records])
    assert np.all(sent >= times - 1e-3) and np.all(sent - times < 0.05)
    assert client.peak == 4


def test_the_closed_loop_keeps_n_in_flight_and_stops_at_the_duration():
    client = InstantClient(delay_s=0.02)
    records = asyncio.run(closed_loop(client, 3, 0.2, length_stream(8, 4), LoadSpec()))
    assert client.peak == 3
    assert 3 * 5 <= len(records) <= 3 * 11  # 0.2 s / 0.02 s per request, per user, give or take
    assert max(r.sent_s for r in records) < 0.2 and [r.index for r in records] == list(range(len(records)))


def test_a_request_past_its_timeout_is_a_timeout_error():
    arr = Arrivals(np.array([0.0]), np.array([8]), np.array([4]))
    (rec,) = asyncio.run(open_loop(InstantClient(delay_s=5), arr, LoadSpec(timeout_s=0.05)))
    assert rec.error_kind == "timeout"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_vllms_request_function_loads_without_importing_vllm():
    had_vllm = "vllm" in sys.modules
    module = load_vllm_request_func()
    assert callable(module.async_request_openai_completions)
    assert ("vllm" in sys.modules) == had_vllm  # nor torch with it

    async def auto() -> str:
        client = open_client("auto", Endpoint("http://h/v1/completions", "m"))
        await client.aclose()
        return client.name

    assert asyncio.run(auto()) == "vllm"


def test_an_unknown_client_is_refused():
    with pytest.raises(EndpointError, match="--client"):
        open_client("curl", Endpoint("http://h/v1/completions", "m"))


def test_plot_series_count_every_token_once():
    t = Timings(np.array([0.0, 1.5]), np.array([0.2, 1.6]), np.array([2.7, 1.6]), np.array([10, 3]))
    per_s = t.tokens_per_second(4)
    assert per_s.sum() == 13 and per_s[1] == 3 + 4  # 10 tokens over [0.2, 2.7]: 4 in [1, 2) plus 3 at 1.6
    ttft = t.ttft_by_second(3)
    assert ttft[0] == pytest.approx(0.2) and ttft[1] == pytest.approx(0.1) and np.isnan(ttft[2])
