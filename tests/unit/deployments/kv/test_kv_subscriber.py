"""The KV event chain from vLLM's own publisher (vllm/distributed/kv_events.py
ZmqEventPublisher, on the ipc sockets the replica's relay gives it) through the replica's relay
(deployments/kv/engine_relay.py, served by uvicorn on loopback) to the door's subscriber
(deployments/kv/kv_subscriber.py, aiohttp) and the KV index: batches published before the door
joined are replayed, hashes land in the index per tier, a gap the engine no longer buffers leaves
the index knowing less, never more, and a replica that goes away is forgotten."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from hbmserve.core.kv_events import BlockStored, Medium
from hbmserve.deployments.kv.engine_relay import EngineKvRelay
from hbmserve.deployments.kv.kv_stream import EVENTS_PATH, REPLAY_PATH, FrameReader, KvStreamError, frame, heartbeat
from hbmserve.deployments.kv.kv_subscriber import KvEventsError, KvSubscriber, decode_batch
from hbmserve.routing.kv_index import KvIndex

kv_events = pytest.importorskip("vllm.distributed.kv_events", reason="vLLM's publisher is the reference")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stored(hashes, medium="GPU", parent=None):
    return kv_events.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=[1] * 16, block_size=16,
                                 lora_id=None, medium=medium, lora_name=None)


def _term_zmq() -> None:
    """End the process-wide ZMQ contexts the publisher and the subscriber used (every socket is
    closed by now), so none is left for the interpreter's exit to tear down under other threads."""
    import zmq
    import zmq.asyncio

    for cls in (zmq.asyncio.Context, zmq.Context):
        if cls._instance is not None and not cls._instance.closed:
            cls._instance.term()


def _batch(*events):
    return kv_events.KVEventBatch(ts=time.time(), events=list(events))


def test_a_batch_decodes_as_vllm_encodes_it():
    import msgspec

    payload = msgspec.msgpack.Encoder().encode(_batch(
        _stored([1, b"\x01\x00"], parent=7), _stored([3], medium="CPU"), _stored([9], medium="STORAGE"),
        kv_events.BlockRemoved(block_hashes=[1], medium="GPU"), kv_events.AllBlocksCleared()))
    b = decode_batch("r0", 4, payload)
    assert (b.replica_id, b.seq) == ("r0", 4) and abs(b.ts - time.time()) < 5
    assert b.events[:2] == (BlockStored((1, 256), 7, Medium.HBM), BlockStored((3,), None, Medium.HOST))
    assert len(b.events) == 4  # the STORAGE tier is not kept
    with pytest.raises(KvEventsError):
        decode_batch("r0", 5, b"\xc1 not msgpack")


async def _serve_relay(relay: EngineKvRelay):
    """The relay's two paths on a loopback uvicorn; returns (server, serve task, url)."""
    import uvicorn

    routes = {EVENTS_PATH: relay.events, REPLAY_PATH: relay.replay}

    async def app(scope, receive, send):
        if scope["type"] == "http":
            await routes[scope["path"]](scope, receive, send)

    port = _port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    return server, task, f"http://127.0.0.1:{port}"


def replay_run(buffer_steps: int, socket_dir: str) -> dict:
    """The scenario below, in this process; returns what the index saw."""
    import aiohttp

    relay = EngineKvRelay(socket_dir, buffer_steps=buffer_steps)
    cfg = relay.vllm_config()
    pub = kv_events.ZmqEventPublisher(0, endpoint=cfg["endpoint"], replay_endpoint=cfg["replay_endpoint"],
                                      buffer_steps=buffer_steps)
    index = KvIndex()

    async def until(predicate, timeout_s=10.0):
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, index.stats()
            await asyncio.sleep(0.02)

    async def scenario():
        server, serving, url = await _serve_relay(relay)
        session = aiohttp.ClientSession()
        sub = KvSubscriber("r0", url, {}, index, lambda: session)
        for h in (10, 11, 12):  # before any door listens: lost to the live stream, kept for replay
            pub.publish(_batch(_stored([h])))
        await asyncio.sleep(0.3)
        task = asyncio.get_running_loop().create_task(sub.run())
        h = 13
        try:
            # The relay's SUB joins a little after the door connects: publish until one gets through.
            while not index.stats().batches:
                pub.publish(_batch(_stored([h])))
                h += 1
                await asyncio.sleep(0.1)
            await until(lambda: index.view("r0").trusted)
            joined = set(index.view("r0").hbm)
            pub.publish(_batch(kv_events.BlockRemoved(block_hashes=[10], medium="GPU"), _stored([99], medium="CPU")))
            await until(lambda: 99 in index.view("r0").host)
            after = set(index.view("r0").hbm)
            streams = relay.streams
            # The replica dies (its sockets reset): the door forgets it at once rather than route
            # on its view.
            server.should_exit = server.force_exit = True
            for conn in list(server.server_state.connections):
                conn.transport.abort()
            await until(lambda: index.stats().replicas == 0)
        finally:
            task.cancel()
            await asyncio.gather(task, serving, return_exceptions=True)
            await session.close()
        return joined, after, h, streams

    try:
        joined, after, last, streams = asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        pub.shutdown()
        relay.close()
        _term_zmq()
    stats = index.stats()
    return {"joined": sorted(joined), "after": sorted(after), "last": last, "resets": stats.resets,
            "gaps": stats.gaps, "streams": streams}


@pytest.mark.parametrize("buffer_steps", [100, 2])
def test_late_join_is_replayed_and_a_lost_gap_leaves_the_index_knowing_less(buffer_steps, tmp_path):
    """100 steps buffered: the history before the join is replayed exactly. 2: it cannot be,
    and the index restarts from what it got (a subset of the truth, flagged as a reset). In a
    child process: vLLM's publisher thread and ZMQ's contexts stay out of pytest's own exit."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[4]
    code = ("import json, sys; from tests.unit.deployments.kv.test_kv_subscriber import replay_run; "
            f"print('RESULT ' + json.dumps(replay_run({buffer_steps}, {str(tmp_path)!r})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    r = json.loads(lines[-1].removeprefix("RESULT "))
    joined, after, truth = set(r["joined"]), set(r["after"]), set(range(10, r["last"]))
    if buffer_steps == 100:  # the stream's opening replay from batch 0 brings all of it
        assert r["resets"] == 0 and joined == truth
    else:  # the replay starts past batch 0: a gap that cannot be filled
        assert r["resets"] >= 1 and r["gaps"] >= 1 and joined < truth and joined
    assert 10 not in after
    assert r["streams"] == 1  # the door's one stream, through the relay


def test_frames_cut_anywhere_read_back_whole():
    stream = frame(0, b"abc") + heartbeat() + frame(7, b"") + frame(2 ** 40, b"x" * 1000)
    for step in (1, 5, 13, len(stream)):
        reader, got = FrameReader(), []
        for i in range(0, len(stream), step):
            got += reader.feed(stream[i:i + step])
        assert got == [(0, b"abc"), (-2, b""), (7, b""), (2 ** 40, b"x" * 1000)] and reader.pending == 0
    with pytest.raises(KvStreamError, match="limit"):
        list(FrameReader().feed((5).to_bytes(8, "big") + (1 << 31).to_bytes(4, "big")))


@pytest.mark.parametrize("start, status", [("0", 200), ("abc", 400), ("-1", 400), ("", 400),
                                           (str(1 << 63), 400), (str((1 << 63) - 1), 200)])
def test_a_replay_asks_for_a_64_bit_sequence_number_or_is_refused(start, status):
    from hbmserve.deployments.kv.kv_stream import serve_replay

    sent = []

    async def send(message):
        sent.append(message)

    async def batches_from(first: int):
        return [(first, b"x")]

    asyncio.run(serve_replay({"query_string": f"from={start}".encode()}, send, batches_from))
    assert sent[0]["status"] == status
