"""The replica's side of the KV event stream (kv_stream.py): the engine publishes on local
`ipc://` sockets, this relays them to the front doors over the replica's own HTTP port.

vLLM's publisher (vllm/distributed/kv_events.py `ZmqEventPublisher`, in the engine core
process) binds an ipc PUB socket (frames: topic, seq, msgpack batch) and an ipc ROUTER for
replay (ask with (b"", first seq); get each buffered batch as (b"", topic, seq, batch), then an
end marker of seq -1). Each door's `GET /hbm/kv/events` gets a SUB socket of its own, so a slow
door never holds back another; what a SUB misses (it joined late, its queue filled) the door
sees as a gap in the sequence numbers and asks `GET /hbm/kv/replay?from=N` for.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from hbmserve.deployments.kv.kv_stream import Batch, serve_events, serve_replay

END_SEQ = -1
REPLAY_TIMEOUT_S = 2.0
BUFFER_STEPS = 10_000  # batches the engine keeps for replay (vLLM's default)


class EngineKvRelay:
    """One engine's KV event sockets, and the two ASGI handlers that relay them."""

    def __init__(self, socket_dir: str | None = None, buffer_steps: int = BUFFER_STEPS) -> None:
        # HBMSERVE_KV_SOCKET_DIR: for a node whose temporary folder is not writable.
        base = Path(socket_dir or os.environ.get("HBMSERVE_KV_SOCKET_DIR") or tempfile.gettempdir()) / f"hbmkv-{secrets.token_hex(6)}"
        self.pub_path, self.replay_path = Path(f"{base}.pub"), Path(f"{base}.replay")
        self.buffer_steps = buffer_steps
        self.streams = 0  # doors subscribed now

    def vllm_config(self) -> dict[str, Any]:
        """vLLM's `--kv-events-config`: ipc endpoints, which its publisher binds."""
        return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{self.pub_path}",
                "replay_endpoint": f"ipc://{self.replay_path}", "buffer_steps": self.buffer_steps}

    def close(self) -> None:
        for p in (self.pub_path, self.replay_path):
            p.unlink(missing_ok=True)

    async def events(self, scope, receive, send) -> None:
        import zmq
        import zmq.asyncio

        sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(f"ipc://{self.pub_path}")

        async def next_batch(timeout_s: float) -> Batch | None:
            if not await sub.poll(timeout_s * 1000):
                return None
            seq, payload = (await sub.recv_multipart())[-2:]
            return int.from_bytes(seq, "big", signed=True), payload

        self.streams += 1
        try:
            await serve_events(receive, send, next_batch)
        finally:
            self.streams -= 1
            sub.close()

    async def replay(self, scope, receive, send) -> None:
        await serve_replay(scope, send, self._buffered)

    async def _buffered(self, start: int) -> list[Batch]:
        """Ask the engine's ROUTER for the batches from `start` on; what came before a timeout is
        what the door gets (its index sees what is still missing)."""
        import zmq
        import zmq.asyncio

        dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"ipc://{self.replay_path}")
        out: list[Batch] = []
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_S)
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END_SEQ:
                    return out
                out.append((seq, frames[-1]))
        except asyncio.TimeoutError:
            return out
        finally:
            dealer.close()
