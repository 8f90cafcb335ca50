"""vLLM's own OpenAI server, run inside a Ray Serve replica on the replica's event loop.

Why not Serve's proxy: on a 2-core machine every extra hop (proxy actor, Ray RPC per streamed
chunk) takes CPU from the engine; Ray Serve LLM measured 0.31x of bare vLLM with defaults and
0.67x with direct streaming + HAProxy (DESIGN.md). Here the replica serves HTTP itself through
vLLM's FastAPI app, so the request path is the same as bare vLLM plus one thin ASGI middleware.
Serve still owns the replica's life: placement, health checks, restarts, scaling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from contextlib import AsyncExitStack

from hbmserve.deployments.admission import AdmissionBudget
from hbmserve.deployments.engine_args import EngineLaunch
from hbmserve.deployments.ingress_middleware import IngressMiddleware, LoadCounters

log = logging.getLogger("hbmserve.replica")


def bind_shared(host: str, port: int) -> socket.socket:
    """Bind with SO_REUSEPORT: every replica of a model on a host listens on the model's one
    port and the kernel spreads connections across them, so a rolling restart or a scale-up
    never moves the endpoint and needs no proxy hop."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port}: {err}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class VLLMHttpServer:
    def __init__(self, launch: EngineLaunch, budget: AdmissionBudget, api_keys: frozenset[str]):
        self.launch = launch
        self.budget = budget
        self.api_keys = api_keys
        self.counters = LoadCounters()
        self.engine_client = None
        self.url: str | None = None
        self._stack = AsyncExitStack()
        self._server = None
        self._task: asyncio.Task | None = None

    def _parse_args(self):
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = make_arg_parser(FlexibleArgumentParser(description="hbmserve replica"))
        return parser.parse_args(list(self.launch.cli_args))

    async def start(self) -> str:
        import uvicorn
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
        from vllm.entrypoints.launchers.app import build_app

        os.environ.update(dict(self.launch.env))
        args = self._parse_args()
        sock = bind_shared(args.host, args.port)
        host, port = sock.getsockname()[:2]
        try:
            self.engine_client = await self._stack.enter_async_context(build_async_engine_client(args))
            tasks = await self.engine_client.get_supported_tasks()
            app = build_app(args, tasks, self.engine_client.model_config)
            await init_app_state(self.engine_client, app.state, args, tasks)
            asgi = IngressMiddleware(app, self.budget, self.api_keys, self.counters)
            config = uvicorn.Config(asgi, log_level="warning", access_log=False, timeout_keep_alive=30)
            self._server = _no_signal_server(config)
            self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
            while not self._server.started:
                if self._task.done():
                    self._task.result()
                await asyncio.sleep(0.05)
        except BaseException:
            sock.close()
            await self._stack.aclose()
            raise
        self.url = f"http://{host}:{port}"
        log.info("serving %s on %s", args.served_model_name, self.url)
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout=10)
        await self._stack.aclose()

    def healthy(self) -> bool:
        return self._task is not None and not self._task.done() and not getattr(self.engine_client, "errored", False)


def _no_signal_server(config):
    """uvicorn.Server that leaves signal handling to Ray: the replica is not the main program."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server(config)
