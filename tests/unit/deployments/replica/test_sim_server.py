"""The simulated engine's OpenAI app and server: protocol estimates, streaming, errors, lifecycle."""

from __future__ import annotations

import asyncio
import json
import zlib

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hbmserve.capacity.perf.hardware import load_catalog
from hbmserve.capacity.perf.scenario import scenario_for
from hbmserve.deployments.replica.sim_engine import SimEngine
from hbmserve.core.config import ModelSpec
from hbmserve.deployments.replica.sim_protocol import (FILLER_WORDS, OUTPUT_ID_BASE, GenerationPlan, PromptView,
                                                       Rejection, estimate_tokens, filler_text, ids_prompt,
                                                       plan_generation, text_prompt, token_text)
from hbmserve.deployments.replica.sim_server import build_sim_openai_app

NAME = "sim-8b"
MML = 2048


def spec(speedup: float = 200.0, startup_s: float = 0.0) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": NAME, "source": "sim", "engine": "sim",
        "engine_settings": {"max_model_len": MML, "max_num_seqs": 8},
        "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b", "speedup": speedup, "startup_s": startup_s}})


def engine(speedup: float = 200.0) -> SimEngine:
    sc = scenario_for(spec(speedup), load_catalog())
    return SimEngine(sc.deployment, sc.engine, speedup=speedup)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def chat_body(content: str = "hello there", **kw) -> dict:
    return {"model": NAME, "messages": [{"role": "user", "content": content}], **kw}


def sse_payloads(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]


async def with_client(fn, speedup: float = 200.0):
    eng = engine(speedup)
    app = build_sim_openai_app(eng, NAME, MML)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
            return await fn(client, eng)
    finally:
        await eng.shutdown()


# ---- pure protocol helpers ----

def test_token_estimate_is_utf8_bytes_over_four_at_least_one():
    assert estimate_tokens("") == 1
    assert estimate_tokens("abc") == 1
    assert estimate_tokens("hello world!") == 3  # 12 bytes
    assert estimate_tokens("héllo wörld ") == 14 // 4  # two 2-byte letters: 14 bytes


def test_filler_text_is_one_word_per_token():
    text = filler_text(40)
    assert text.split(" ") == [FILLER_WORDS[i % len(FILLER_WORDS)] for i in range(40)]
    assert "".join(token_text(i) for i in range(40)) == text


def test_a_prompt_ending_in_the_engines_own_output_ids_resumes_that_reply():
    text = text_prompt("resume me, please")
    whole = plan_generation(text, None, 4096)
    assert text.ids() and all(i < OUTPUT_ID_BASE for i in text.ids())
    resumed = ids_prompt(text.ids() + [OUTPUT_ID_BASE + i for i in range(5)])
    assert (resumed.key, resumed.resume_at, resumed.tokens) == (text.key, 5, text.tokens + 5)
    plan = plan_generation(resumed, None, 4096)
    # The rest of the same reply: its natural end, and its words from position 5 on.
    assert (plan.output_tokens, plan.first_position, plan.finish_reason) == (whole.output_tokens - 5, 5, "stop")
    assert filler_text(5) + filler_text(plan.output_tokens, 5) == filler_text(whole.output_tokens)
    # Output ids out of order, or ids past uint32 that are not this engine's: an ordinary prompt.
    assert ids_prompt([7, OUTPUT_ID_BASE + 1]).resume_at == 0
    assert ids_prompt([OUTPUT_ID_BASE * 3]).key == str(OUTPUT_ID_BASE * 3).encode()


def test_explicit_max_tokens_is_exact_or_rejected_naming_the_limit():
    p = PromptView(b"p", 10)
    assert plan_generation(p, 30, 100) == GenerationPlan(10, 30, "length")
    assert plan_generation(p, 90, 100) == GenerationPlan(10, 90, "length")
    rej = plan_generation(p, 91, 100)
    assert isinstance(rej, Rejection) and rej.param == "max_tokens"
    assert "91" in rej.message and "100" in rej.message


def test_without_max_tokens_the_reply_stops_at_its_natural_length():
    natural = 16 + zlib.crc32(b"some prompt") % 241
    assert plan_generation(PromptView(b"some prompt", 5), None, 4096) == GenerationPlan(5, natural, "stop")
    # Context runs out first: cut at max_model_len, like vLLM's default max_tokens.
    assert plan_generation(PromptView(b"some prompt", 5), None, 5 + 3) == GenerationPlan(5, 3, "length")
    rej = plan_generation(PromptView(b"some prompt", 4096), None, 4096)
    assert isinstance(rej, Rejection) and rej.param == "prompt" and "4096" in rej.message


@given(st.integers(1, 5000), st.none() | st.integers(1, 5000), st.integers(1, 5000), st.text(max_size=20))
def test_a_plan_always_fits_the_context(prompt, max_tokens, mml, key):
    plan = plan_generation(PromptView(key.encode(), prompt), max_tokens, mml)
    room = mml - prompt
    if isinstance(plan, Rejection):
        assert (max_tokens or 1) > room
        return
    assert 1 <= plan.output_tokens <= room
    if max_tokens is not None:
        assert (plan.output_tokens, plan.finish_reason) == (max_tokens, "length")
    else:
        natural = 16 + zlib.crc32(key.encode()) % 241
        assert plan.output_tokens == min(natural, room)
        assert (plan.finish_reason == "stop") == (natural <= room)


# ---- the app, in-process ----

def test_models_lists_the_one_model_with_its_context_length():
    async def go(c, _):
        return (await c.get("/v1/models")).json()

    body = run(with_client(go))
    assert [m["id"] for m in body["data"]] == [NAME]
    assert body["data"][0]["max_model_len"] == MML


def test_chat_returns_max_tokens_words_and_counts_usage():
    async def go(c, _):
        return await c.post("/v1/chat/completions", json=chat_body("hello there", max_tokens=7))

    r = run(with_client(go))
    assert r.status_code == 200
    body = r.json()
    rendered = "<|user|>\nhello there\n<|assistant|>\n"
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == filler_text(7)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(rendered.encode()) // 4, "completion_tokens": 7,
                             "total_tokens": len(rendered.encode()) // 4 + 7}


def test_completion_without_max_tokens_stops_by_itself():
    prompt = "the model and its cache live in HBM"

    async def go(c, _):
        return (await c.post("/v1/completions", json={"model": NAME, "prompt": prompt})).json()

    body = run(with_client(go))
    natural = 16 + zlib.crc32(prompt.encode()[:len(prompt) // 4 * 4]) % 241  # the bytes of its token ids
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == natural
    assert len(body["choices"][0]["text"].split(" ")) == natural
    assert body["usage"]["prompt_tokens"] == len(prompt.encode()) // 4


def test_token_id_prompts_count_their_ids():
    async def go(c, _):
        return (await c.post("/v1/completions", json={"model": NAME, "prompt": [[5] * 37], "max_tokens": 2})).json()

    assert run(with_client(go))["usage"]["prompt_tokens"] == 37


@pytest.mark.parametrize("chat", [True, False])
def test_streaming_delivers_every_token_then_usage_then_done(chat):
    n = 23
    opts = {"max_tokens": n, "stream": True, "stream_options": {"include_usage": True}}
    path, body = (("/v1/chat/completions", chat_body("stream please", **opts)) if chat else
                  ("/v1/completions", {"model": NAME, "prompt": "stream please", **opts}))

    async def go(c, _):
        async with c.stream("POST", path, json=body) as r:
            return r.status_code, r.headers["content-type"], (await r.aread()).decode()

    status, ctype, text = run(with_client(go))
    assert status == 200 and ctype.startswith("text/event-stream")
    events = sse_payloads(text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    if chat:
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        chunks = chunks[1:]
    *tokens, usage_chunk = chunks
    pieces = [c["choices"][0]["delta"]["content"] if chat else c["choices"][0]["text"] for c in tokens]
    assert pieces == [token_text(i) for i in range(n)]
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * (n - 1) + ["length"]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == n
    assert len({c["id"] for c in chunks}) == 1


def test_token_ids_come_where_vllm_puts_them_and_a_reply_resumes_from_them():
    async def go(c, _):
        r = await c.post("/v1/chat/completions", json=chat_body("ids please", stream=True, return_token_ids=True))
        events = [json.loads(p) for p in sse_payloads(r.text) if p != "[DONE]"]
        prompt_ids = events[0]["prompt_token_ids"]  # chat: on the role chunk, at the top level
        ids = [i for e in events[1:] for i in e["choices"][0]["token_ids"]]
        text = "".join(e["choices"][0]["delta"]["content"] for e in events[1:])
        rest = (await c.post("/v1/completions", json={"model": NAME, "prompt": prompt_ids + ids[:3],
                                                      "return_token_ids": True})).json()
        return prompt_ids, ids, text, rest

    prompt_ids, ids, text, rest = run(with_client(go))
    assert len(prompt_ids) == len(b"<|user|>\nids please\n<|assistant|>\n") // 4
    assert ids == [OUTPUT_ID_BASE + i for i in range(len(ids))]
    choice = rest["choices"][0]
    assert choice["token_ids"] == ids[3:] and choice["finish_reason"] == "stop"
    assert filler_text(3) + choice["text"] == text
    assert rest["usage"] == {"prompt_tokens": len(prompt_ids) + 3, "completion_tokens": len(ids) - 3,
                             "total_tokens": len(prompt_ids) + len(ids)}


def test_streaming_without_include_usage_sends_no_usage_chunk():
    async def go(c, _):
        async with c.stream("POST", "/v1/completions", json={"model": NAME, "prompt": "x", "max_tokens": 4,
                                                             "stream": True}) as r:
            return (await r.aread()).decode()

    events = sse_payloads(run(with_client(go)))
    assert events[-1] == "[DONE]" and len(events) == 5
    assert all("usage" not in json.loads(e) for e in events[:-1])


def error_of(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == r.status_code
    return body["error"]


def test_unknown_model_is_404_in_openai_shape():
    async def go(c, _):
        return await c.post("/v1/chat/completions", json={**chat_body(), "model": "no-such-model"})

    r = run(with_client(go))
    assert r.status_code == 404
    err = error_of(r)
    assert "no-such-model" in err["message"] and err["type"] == "NotFoundError" and err["param"] == "model"


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({"model": NAME, "prompt": "hi", "max_tokens": MML}, "max_tokens", str(MML)),
    # 5 bytes a word: (MML*4//5 + 1) words are 4*MML + 3 bytes, i.e. MML tokens, leaving no room.
    ({"model": NAME, "prompt": "word " * (MML * 4 // 5 + 1), "max_tokens": 4}, "max_tokens", str(MML)),
    ({"model": NAME, "prompt": "word " * (MML * 4 // 5 + 1)}, "prompt", str(MML)),
    ({"model": NAME, "prompt": ["a", "b"], "max_tokens": 4}, "prompt", "one prompt"),
])
def test_too_long_requests_are_400_naming_the_field(body, param, needle):
    async def go(c, eng):
        r = await c.post("/v1/completions", json=body)
        return r, eng.stats()

    r, stats = run(with_client(go))
    assert r.status_code == 400
    err = error_of(r)
    assert err["type"] == "BadRequestError" and err["param"] == param and needle in err["message"]
    assert stats.waiting == 0 and stats.running == 0  # never reached the engine


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"model": NAME}, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": []}, "messages"),
    ("/v1/completions", {"model": NAME, "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"model": NAME, "prompt": "x", "n": 2}, "n"),
    ("/v1/completions", {"prompt": "x"}, "model"),
])
def test_invalid_bodies_are_400_not_422(path, body, param):
    async def go(c, _):
        return await c.post(path, json=body)

    r = run(with_client(go))
    assert r.status_code == 400
    err = error_of(r)
    assert err["param"] == param and err["message"].startswith(param)


def test_malformed_json_is_400():
    async def go(c, _):
        return await c.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})

    r = run(with_client(go))
    assert r.status_code == 400
    err = error_of(r)
    assert err["type"] == "BadRequestError" and err["param"] is None and "JSON" in err["message"]
