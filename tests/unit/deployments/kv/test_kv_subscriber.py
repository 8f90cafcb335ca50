"""The door's KV event subscription (deployments/kv/kv_subscriber.py) against vLLM's own
publisher (vllm/distributed/kv_events.py ZmqEventPublisher, real ZMQ on loopback): batches
published before the subscriber joined are replayed, hashes land in the index per tier, and a
gap the engine no longer buffers leaves the index knowing less, never more."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from hbmserve.core.kv_events import BlockStored, Medium
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


def replay_run(buffer_steps: int) -> dict:
    """The scenario below, in this process; returns what the index saw."""
    live, replay = _port(), _port()
    pub = kv_events.ZmqEventPublisher(0, endpoint=f"tcp://127.0.0.1:{live}",
                                      replay_endpoint=f"tcp://127.0.0.1:{replay}", buffer_steps=buffer_steps)
    index = KvIndex()
    # vLLM connects its PUB to a concrete address: the subscriber listens (loopback only).
    sub = KvSubscriber("r0", f"tcp://127.0.0.1:{live}", f"tcp://127.0.0.1:{replay}", index, bind=True)

    async def until(predicate, timeout_s=10.0):
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, index.stats()
            await asyncio.sleep(0.02)

    async def scenario():
        for h in (10, 11, 12):  # before anyone listens: lost to the PUB socket, kept for replay
            pub.publish(_batch(_stored([h])))
        await asyncio.sleep(0.3)
        task = asyncio.get_running_loop().create_task(sub.run())
        h = 13
        try:
            # The PUB joins a little after the bind: publish until a batch gets through.
            while not index.stats().batches:
                pub.publish(_batch(_stored([h])))
                h += 1
                await asyncio.sleep(0.1)
            await until(lambda: index.view("r0").trusted)
            joined = set(index.view("r0").hbm)
            pub.publish(_batch(kv_events.BlockRemoved(block_hashes=[10], medium="GPU"), _stored([99], medium="CPU")))
            await until(lambda: 99 in index.view("r0").host)
            after = set(index.view("r0").hbm)
        finally:
            task.cancel()
        return joined, after, h

    try:
        joined, after, last = asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        pub.shutdown()
        _term_zmq()
    stats = index.stats()
    return {"joined": sorted(joined), "after": sorted(after), "last": last, "resets": stats.resets,
            "gaps": stats.gaps, "dropped": sub.dropped}


@pytest.mark.parametrize("buffer_steps", [100, 2])
def test_late_join_is_replayed_and_a_lost_gap_leaves_the_index_knowing_less(buffer_steps):
    """100 steps buffered: the history before the join is replayed exactly. 2: it cannot be,
    and the index restarts from what it got (a subset of the truth, flagged as a reset). In a
    child process: vLLM's publisher thread and ZMQ's contexts stay out of pytest's own exit."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[4]
    code = ("import json, sys; from tests.unit.deployments.kv.test_kv_subscriber import replay_run; "
            f"print('RESULT ' + json.dumps(replay_run({buffer_steps})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    r = json.loads(lines[-1].removeprefix("RESULT "))
    joined, after, truth = set(r["joined"]), set(r["after"]), set(range(10, r["last"]))
    if buffer_steps == 100:
        assert r["resets"] == 0 and joined == truth
    else:
        assert r["resets"] >= 1 and joined < truth and joined
    assert 10 not in after and r["gaps"] >= 1
    assert r["dropped"] == 0
