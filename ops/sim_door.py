"""A local OpenAI endpoint of simulated engines, without Ray: the front door's app and hardened
HTTP server (deployments/ingress/front_door_app.py, hardened_http.py) in front of `SimHttpServer`
replicas, `replicas` of each `engine: sim` model of a config, on one event loop.

For trying `hbmserve bench` on a laptop and for its tests; `hbmserve up` is the real thing
(replicas placed and autoscaled by Ray Serve, discovered through Ray). What is the same: the
request path (auth from `serve.auth`, admission and its 429s, the shared router, the relay) and
the simulated engines. What is not: no discovery, autoscaling or placement; the replica count
stays as configured.

    python -m hbmserve.ops.sim_door --config cluster.yaml --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets

from hbmserve.core.config import ClusterSpec
from hbmserve.core.engine_settings import EngineKind
from hbmserve.core.records import ReplicaEndpoint
from hbmserve.deployments.ingress.front_door_access import AccessGuard, KeyFiles, reload_keys
from hbmserve.deployments.ingress.front_door_app import FrontDoorApp
from hbmserve.deployments.ingress.request_body import BodyLimits
from hbmserve.deployments.ingress.front_door_queue import ModelAdmission
from hbmserve.deployments.wire.hardened_http import HardenedServer, HttpLimits, listen_socket
from hbmserve.deployments.ingress.replica_table import POLL_S, ReplicaTable
from hbmserve.deployments.wire.names import engine_deployment_name
from hbmserve.deployments.replica.engine_replica import replica_budget
from hbmserve.deployments.replica.sim_server import SimHttpServer


class SimDoor:
    """`async with SimDoor(spec) as door:` serves on `door.url` until the block ends."""

    def __init__(self, spec: ClusterSpec, host: str = "127.0.0.1", port: int = 0,
                 endpoints: list[ReplicaEndpoint] | None = None, token: str | None = None):
        """`endpoints`: replicas already serving elsewhere (with `token`, their internal token)
        instead of the ones this door would start (ops/bench/door_cpu.py runs them apart)."""
        models = [m for m in spec.models if m.engine is EngineKind.SIM]
        if not models:
            raise ValueError("the config has no `engine: sim` model to serve")
        self.spec = spec.model_copy(update={"models": models})
        self.host, self.port = host, port
        self.token = token or secrets.token_hex(16)
        self.external = endpoints
        self.url = ""

    async def __aenter__(self) -> SimDoor:
        import aiohttp

        http = self.spec.serve.http
        auth = self.spec.serve.auth
        keys = KeyFiles(auth) if auth is not None else None
        guard = AccessGuard(keys.ring() if keys else None)
        self.replicas: list[SimHttpServer] = []
        endpoints = list(self.external or [])
        for m in self.spec.models if self.external is None else []:
            for i in range(m.replicas):
                server = SimHttpServer(m, self.host, replica_budget(m), self.token)
                self.replicas.append(server)
                url = await server.start()
                endpoints.append(ReplicaEndpoint(app=m.name, deployment=engine_deployment_name(m), replica=f"r{i}",
                                                 model=m.name, url=url, node_id="local", at=0.0))
        self.table = ReplicaTable([m.name for m in self.spec.models], set())
        self.table.update(endpoints, {})
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        self.admission = {m.name: ModelAdmission(m, self.table) for m in self.spec.models}
        self.app = FrontDoorApp(self.spec, self.table, guard, self.admission, lambda: self.session, self.token,
                                BodyLimits(http.max_body_bytes, http.body_timeout_s, http.first_byte_timeout_s))
        await self.table.poll(self.app.upstream, self.token)
        sock = listen_socket(self.host, self.port, shared=False)
        self.url = "http://{}:{}".format(*sock.getsockname()[:2])
        self.server = HardenedServer(self.app, HttpLimits.of(http),
                                     on_refused=lambda code: self.app.refusals.note(None, code, None))
        await self.server.start([sock])
        loop = asyncio.get_running_loop()
        self.loops = [loop.create_task(self._poll())]
        if keys is not None:
            self.loops.append(loop.create_task(self._reload(keys, guard)))
        return self

    async def _poll(self) -> None:
        """As the front door's loop: fresh replica loads, then release what now fits."""
        while True:
            await asyncio.sleep(POLL_S)
            await self.table.poll(self.app.upstream, self.token)
            for gate in self.admission.values():
                gate.pump()

    @staticmethod
    async def _reload(keys: KeyFiles, guard: AccessGuard) -> None:
        while True:  # as the front door: a changed keys file takes effect without a restart
            await asyncio.sleep(KeyFiles.RELOAD_S)
            await reload_keys(keys, guard)

    async def __aexit__(self, *exc: object) -> None:
        for task in self.loops:
            task.cancel()
        for task in self.loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.server.stop()
        await self.session.close()
        await self.app.upstream.close()
        for r in self.replicas:
            await r.stop()


def main(argv: list[str] | None = None) -> None:
    from hbmserve.core.config import load_cluster_spec

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="cluster YAML with `engine: sim` models")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)

    async def serve() -> None:
        async with SimDoor(load_cluster_spec(args.config), args.host, args.port) as door:
            names = ", ".join(f"{m.name} x{m.replicas}" for m in door.spec.models)
            print(f"serving {names} on {door.url} (Ctrl-C stops)", flush=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
