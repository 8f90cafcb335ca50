"""The simulated engine publishes its KV events as a vLLM replica does (deployments/replica/sim_kv.py):
a real SimHttpServer on loopback, the doors' real subscribers and index (deployments/kv/door_kv.py)
over HTTP. What a door hashes for a request is what the engine reports storing; a door that joins
late catches up by replay; a door whose queue overflows sees the gap and replays it; a replica
that stops is forgotten."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from hbmserve.core.kv_events import BlockRemoved, BlockStored, Medium
from hbmserve.core.records import HASHING_TEXT, KvEventsInfo, ReplicaEndpoint
from hbmserve.deployments.kv.door_kv import DoorKv
from hbmserve.deployments.kv.kv_subscriber import decode_batch, encode_batch
from hbmserve.deployments.replica.sim_kv import SimKvPublisher
from hbmserve.deployments.replica.sim_server import SimHttpServer
from hbmserve.routing.replica_cap import AdmissionBudget
from tests.unit.deployments.replica.test_sim_server import NAME, run, spec

HEADERS = {"x-hbmserve-internal": "token"}
CHAT = ("/v1/chat/completions", {"messages": [{"role": "system", "content": "You answer about invoices. " * 30},
                                              {"role": "user", "content": "Where is my refund?"}]})
COMPLETION = ("/v1/completions", {"prompt": "the cache lives in memory " * 20})


def caching_model(kv_events: bool = True):
    s = spec()
    return s.model_copy(update={"engine_settings": s.engine_settings.model_copy(
        update={"enable_prefix_caching": True, "kv_events": kv_events})})


async def until(predicate, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def endpoint(server: SimHttpServer) -> ReplicaEndpoint:
    return ReplicaEndpoint(app=NAME, deployment="d", replica="r0", model=NAME, url=server.url, node_id="n",
                           at=time.time(), kv_events=server.kv_events)


def test_a_door_sees_what_the_simulated_engine_stores_under_the_hashes_it_computes():
    async def go():
        server = SimHttpServer(caching_model(), "127.0.0.1", AdmissionBudget(8), "token")
        await server.start()
        async with aiohttp.ClientSession() as session:
            early, late = DoorKv(HEADERS, lambda: session), DoorKv(HEADERS, lambda: session)
            try:
                early.sync(NAME, [endpoint(server)])
                await until(lambda: early.reports()[NAME].streams == 1, "the stream is up")
                want = {}
                for path, body in (CHAT, COMPLETION):
                    want[path] = early.hashes(NAME, path, body)
                    async with session.post(server.url + path, headers=HEADERS,
                                            json={"model": NAME, "max_tokens": 2, **body}) as r:
                        assert r.status == 200, await r.text()
                    await until(lambda: set(want[path]) <= set(early.view(NAME, "r0").hbm), f"{path} stored")
                late.sync(NAME, [endpoint(server)])  # joins after every batch: replays from batch 0
                await until(lambda: all(set(h) <= set(late.view(NAME, "r0").hbm) for h in want.values()),
                            "the late door replays")
                reports = (early.reports()[NAME], late.reports()[NAME])
                await server.stop()  # its streams break: both doors forget it at once
                await until(lambda: not early.view(NAME, "r0").trusted and not late.view(NAME, "r0").trusted,
                            "a stopped replica is forgotten")
                return want, reports, server.kv_events
            finally:
                await early.close()
                await late.close()
                await server.stop()

    want, (early, late), info = run(go())
    assert info.hashing == HASHING_TEXT and info.block_size == 16
    assert len(want["/v1/chat/completions"]) > 10 and len(want["/v1/completions"]) > 5
    assert early.tokenizer.startswith("not needed") and early.hashed == 2 and early.index.resets == 0
    assert late.index.resets == 0 and late.index.batches >= 2


def test_without_kv_events_the_simulated_engine_publishes_nothing():
    async def go():
        server = SimHttpServer(caching_model(kv_events=False), "127.0.0.1", AdmissionBudget(8), "token")
        await server.start()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(server.url + "/hbm/kv/events", headers=HEADERS) as r:
                    return server.kv_events, r.status
        finally:
            await server.stop()

    info, status = run(go())
    assert info is None and status == 404


def test_a_door_that_falls_behind_sees_the_gap_and_replays_it():
    """A door's queue holds 2 batches; 12 published at once: 10 are dropped for it, and the next
    live batch shows the gap, which the replay path fills from the buffer."""
    import uvicorn

    pub = SimKvPublisher(block_size=16, queue_batches=2)

    async def app(scope, receive, send):
        if scope["type"] == "http":
            await (pub.events if scope["path"] == "/hbm/kv/events" else pub.replay)(scope, receive, send)

    async def go():
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        serving = asyncio.get_running_loop().create_task(server.serve())
        await until(lambda: server.started, "uvicorn up")
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        ep = ReplicaEndpoint(app=NAME, deployment="d", replica="r0", model=NAME, url=url, node_id="n", at=time.time(),
                             kv_events=KvEventsInfo(hashing=HASHING_TEXT, block_size=16))
        async with aiohttp.ClientSession() as session:
            door = DoorKv({}, lambda: session)
            try:
                door.sync(NAME, [ep])
                await until(lambda: pub.streams == 1, "the door subscribed")
                for h in range(12):
                    pub.publish((BlockStored((h,)),))
                await asyncio.sleep(0.1)
                pub.publish((BlockStored((99,)), BlockRemoved((0,))))
                await until(lambda: 99 in door.view(NAME, "r0").hbm, "the last batch arrives")
                return set(door.view(NAME, "r0").hbm), door.reports()[NAME], pub.dropped
            finally:
                await door.close()
                server.should_exit = True
                await serving

    held, report, dropped = run(go())
    assert dropped == 10
    assert held == set(range(1, 12)) | {99}  # all of it, block 0 removed: the gap was replayed
    assert report.index.gaps == 1 and report.index.resets == 0


@pytest.mark.parametrize("medium", [Medium.HBM, Medium.HOST])
def test_the_batches_read_back_as_vllm_encodes_them(medium):
    import msgspec
    from vllm.distributed import kv_events as vllm_events  # the encoding is checked against vLLM's own

    name = medium.value  # vLLM's tier names
    events = (BlockStored((5, 6), 4, medium), BlockRemoved((5,), medium))
    ours = encode_batch(12.5, events, 16)
    theirs = msgspec.msgpack.Encoder().encode(vllm_events.KVEventBatch(ts=12.5, events=[
        vllm_events.BlockStored(block_hashes=[5, 6], parent_block_hash=4, token_ids=[], block_size=16, lora_id=None,
                                medium=name, lora_name=None),
        vllm_events.BlockRemoved(block_hashes=[5], medium=name)]))
    assert msgspec.msgpack.decode(ours) == msgspec.msgpack.decode(theirs)
    assert decode_batch("r", 3, ours).events == events
