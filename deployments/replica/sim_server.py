"""The simulated engine (deployments/replica/sim_engine.py) served over a small OpenAI-compatible HTTP app.

`SimHttpServer` meets the same `EngineServer` contract as `VLLMHttpServer` (engine_server.py)
and has the same data path: one FastAPI app behind `ReplicaMiddleware` (replica_middleware.py), served
by uvicorn on the replica's event loop, on a private port behind the front door. Tokens arrive at the pace the
performance model predicts for `sim.gpu` running `sim.model_config_name` at the model's TP/PP,
`sim.speedup` times faster, so the real Serve control plane can run tens of "70B on H100"
replicas on two cores. What the protocol estimates (prompt tokens, reply text) is in
sim_protocol.py.

With `engine_settings.enable_prefix_caching`, each text prompt is cut into block hashes the way
the ingress cuts it (routing/prefix.py: chat messages rendered by `chat_prompt_text`, 64
characters a block, so one hash names 64 / BYTES_PER_TOKEN = 16 estimated tokens), and the
engine's prefix cache hits are real; `engine_stats()` reports prompt tokens and cache hits.
Prompts given as token ids are not hashed. With `engine_settings.kv_events` too (the default),
the engine publishes its KV events as a vLLM replica does (sim_kv.py), and the doors route by them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from prometheus_client.metrics_core import Metric

from hbmserve.core.config import ModelSpec
from hbmserve.core.records import HASHING_TEXT, KvEventsInfo
from hbmserve.deployments.kv.kv_stream import EVENTS_PATH, REPLAY_PATH
from hbmserve.deployments.replica.engine_args import publishes_kv_events
from hbmserve.deployments.replica.sim_kv import SimKvPublisher
from hbmserve.routing.replica_cap import AdmissionBudget
from hbmserve.deployments.replica.replica_middleware import AdapterRegistry
from hbmserve.deployments.replica.replica_middleware import LoadCounters, ReplicaMiddleware
from hbmserve.deployments.replica.replica_http import AsgiListener, EngineLoad
from hbmserve.deployments.replica.sim_metrics import GaugeStats, RequestTimer, SimEngineMetrics
from hbmserve.deployments.replica.standby_sleep import AwakeGate
from hbmserve.deployments.replica.sim_protocol import (BYTES_PER_TOKEN, OUTPUT_ID_BASE, ChatRequest, CompletionRequest,
                                                       GenerationPlan, Rejection, chat_prompt, completion_prompt,
                                                       error_body, filler_text, plan_generation, token_text, usage)
from hbmserve.routing.prefix import DEFAULT_BLOCK_CHARS, chat_prompt_text, prompt_block_hashes

log = logging.getLogger("hbmserve.deployments.replica")


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def _sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class _Reply:
    """One request's response envelope: the same id/created/model on every chunk. With
    `token_ids` (vLLM's `return_token_ids`), chunks carry token ids where vLLM puts them."""

    def __init__(self, chat: bool, model: str, plan: GenerationPlan, prompt_ids: list[int] | None = None):
        self.chat, self.model, self.plan, self.prompt_ids = chat, model, plan, prompt_ids
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def _ids(self, positions: range) -> dict:
        return {} if self.prompt_ids is None else {"token_ids": [OUTPUT_ID_BASE + p for p in positions]}

    def role_chunk(self) -> dict:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ids = {} if self.prompt_ids is None else {"prompt_token_ids": self.prompt_ids}
        return self._envelope("chat.completion.chunk", [choice]) | ids

    def chunk(self, i: int, finish: str | None) -> dict:
        """The chunk of the plan's i-th token."""
        at = self.plan.first_position + i
        if self.chat:
            choice = {"index": 0, "delta": {"content": token_text(at)}, "logprobs": None, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", [choice | self._ids(range(at, at + 1))])
        choice = {"index": 0, "text": token_text(at), "logprobs": None, "finish_reason": finish}
        if self.prompt_ids is not None:
            choice["prompt_token_ids"] = self.prompt_ids if i == 0 else None
        return self._envelope("text_completion", [choice | self._ids(range(at, at + 1))])

    def usage_chunk(self, n: int) -> dict:
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", []) | {
            "usage": usage(self.plan, n)}

    def whole(self, n: int) -> dict:
        start = self.plan.first_position
        text, ids = filler_text(n, start), self._ids(range(start, start + n))
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": self.plan.finish_reason}
            body = self._envelope("chat.completion", [choice | ids])
            body |= {} if self.prompt_ids is None else {"prompt_token_ids": self.prompt_ids}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.plan.finish_reason}
            choice |= {} if self.prompt_ids is None else {"prompt_token_ids": self.prompt_ids}
            body = self._envelope("text_completion", [choice | ids])
        return body | {"usage": usage(self.plan, n)}


def prefix_hashes(req: CompletionRequest | ChatRequest, hash_block_tokens: int) -> tuple[int, ...]:
    """The prompt's block hashes, in blocks of the engine's `hash_block_tokens` (estimated tokens)."""
    block_chars = hash_block_tokens * BYTES_PER_TOKEN
    if isinstance(req, ChatRequest):
        return prompt_block_hashes(chat_prompt_text([m.model_dump() for m in req.messages]), block_chars)
    prompt = req.prompt[0] if isinstance(req.prompt, list) and len(req.prompt) == 1 else req.prompt
    return prompt_block_hashes(prompt, block_chars) if isinstance(prompt, str) else ()


async def _timed(tokens: AsyncIterator[int], timer: RequestTimer | None) -> AsyncIterator[int]:
    """The engine's tokens, each one timed as it leaves the engine (sim_metrics.py)."""
    try:
        async for i in tokens:
            if timer is not None:
                timer.token(time.monotonic())
            yield i
        if timer is not None:
            timer.finish()
    finally:
        await tokens.aclose()


def build_sim_openai_app(engine, model_name: str, max_model_len: int, metrics: SimEngineMetrics | None = None,
                         adapters: tuple[str, ...] = (), kv_seconds: Callable[[int], float] | None = None):
    """The FastAPI app over a started-or-lazy `SimEngine`; no listener, no middleware.
    `metrics`: where the engine's timings go (vLLM's histograms under vLLM's names).
    `kv_seconds`: the virtual seconds a prompt's KV of n tokens takes to arrive from a prefill
    replica; None: the engine takes no hand-off and computes every prompt itself."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException

    from hbmserve.deployments.replica.sim_engine import RequestRejected

    app = FastAPI(title=f"hbmserve sim: {model_name}", docs_url=None, redoc_url=None, openapi_url=None)
    engine_id = uuid.uuid4().hex

    @app.exception_handler(OpenAIError)
    async def _openai_error(_, exc: OpenAIError):
        return JSONResponse(error_body(exc.status, exc.message, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(_, exc: RequestValidationError):
        # OpenAI answers 400 for a malformed body, not FastAPI's 422.
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request", "type": ""}
        loc = [str(p) for p in first["loc"] if p != "body"]
        field = ".".join(loc) if loc and first.get("type") != "json_invalid" else None
        message = f"{field}: {first['msg']}" if field else f"invalid request body: {first['msg']}"
        return JSONResponse(error_body(400, message, field), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http_error(_, exc: HTTPException):
        return JSONResponse(error_body(exc.status_code, str(exc.detail), None), status_code=exc.status_code)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if engine.stats().ready else 503)

    @app.get("/v1/models")
    async def models():
        def card(name: str, parent: str | None) -> dict:
            return {"id": name, "object": "model", "created": 0, "owned_by": "hbmserve", "root": name,
                    "parent": parent, "max_model_len": max_model_len}
        return {"object": "list", "data": [card(model_name, None), *(card(a, model_name) for a in adapters)]}

    async def serve(req: CompletionRequest | ChatRequest, chat: bool):
        # An adapter's name is served like the base model's (the simulated engine has no weights
        # to change); the reply names what was asked for, as vLLM's does.
        if req.model != model_name and req.model not in adapters:
            raise OpenAIError(404, f"The model `{req.model}` does not exist.", "model")
        if chat:
            prompt, max_tokens = chat_prompt(req), req.max_completion_tokens or req.max_tokens
        else:
            prompt, max_tokens = completion_prompt(req), req.max_tokens
            if isinstance(prompt, Rejection):
                raise OpenAIError(400, prompt.message, prompt.param)
        plan = plan_generation(prompt, max_tokens, max_model_len)
        if isinstance(plan, Rejection):
            raise OpenAIError(400, plan.message, plan.param)
        reply = _Reply(chat, req.model, plan, prompt.ids() if req.return_token_ids else None)
        cfg = engine.core.cfg
        hashes = prefix_hashes(req, cfg.hash_block_tokens) if cfg.enable_prefix_caching else ()
        timer = metrics.request(time.monotonic(), plan.prompt_tokens) if metrics is not None else None
        adapter = None if req.model == model_name else req.model
        handoff = req.kv_transfer_params or {}
        preloaded = 0
        if handoff.get("do_remote_prefill") and kv_seconds is not None:
            # The prompt's KV comes from the prefill replica: its transfer, then only the last
            # prompt token is computed (as vLLM's connectors do).
            preloaded = plan.prompt_tokens - 1
            await asyncio.sleep(kv_seconds(preloaded) / engine.speedup)
            if metrics is not None:
                metrics.external_queries.inc(plan.prompt_tokens)
                metrics.external_hits.inc(preloaded)
        tokens = _timed(engine.generate(reply.id, plan.prompt_tokens, plan.output_tokens, hashes, adapter,
                                        preloaded=preloaded), timer)
        # Wait for the first token before answering: errors then become 4xx/5xx, and the first
        # body byte (the ingress middleware's TTFT sample) is the first token, as with vLLM.
        try:
            first = await anext(tokens)
        except RequestRejected as err:
            raise OpenAIError(400, str(err), "max_tokens") from None
        except StopAsyncIteration:
            raise OpenAIError(503, "the simulated engine is shutting down") from None
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_stream(reply, first, tokens, include_usage), media_type="text/event-stream")
        n = 1 + sum([1 async for _ in tokens])
        if n < plan.output_tokens:
            raise OpenAIError(503, "the simulated engine stopped before the reply was complete")
        body = reply.whole(n)
        if handoff.get("do_remote_decode") and kv_seconds is not None:  # the KV is kept for a decode replica
            body["kv_transfer_params"] = {"do_remote_prefill": True, "do_remote_decode": False,
                                          "remote_engine_id": engine_id, "remote_block_ids": [],
                                          "remote_host": None, "remote_port": None}
        return JSONResponse(body)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        return await serve(req, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest):
        return await serve(req, chat=True)

    return app


async def _stream(reply: _Reply, first: int, tokens: AsyncIterator[int], include_usage: bool) -> AsyncIterator[bytes]:
    last = reply.plan.output_tokens - 1
    try:
        if reply.chat:
            yield _sse(reply.role_chunk())
        n, i = 0, first
        while True:
            n += 1
            yield _sse(reply.chunk(i, reply.plan.finish_reason if i == last else None))
            if i == last:
                async for _ in tokens:  # to the engine's end, where the request's TPOT and e2e are recorded
                    pass
                break
            try:
                i = await anext(tokens)
            except StopAsyncIteration:
                yield _sse(error_body(503, "the simulated engine stopped before the reply was complete", None))
                break
        if include_usage:
            yield _sse(reply.usage_chunk(n))
        yield b"data: [DONE]\n\n"
    finally:
        # A client that goes away mid-stream cancels this generator: free its engine slot now,
        # not whenever the garbage collector finalizes the token stream.
        await tokens.aclose()


def sim_wake_s(model: ModelSpec, gpu) -> float:
    """Seconds a sleeping simulated replica takes to wake: the start-up timeline's wake (its
    weights back over `gpu`'s host link, capacity/perf/startup_timeline.py), `sim.speedup` times
    faster like everything the simulated engine does; 0 without start-up measurements."""
    from hbmserve.capacity.perf.startup_measured import startup_inputs_for
    from hbmserve.capacity.perf.startup_timeline import Phase, StartKind, timeline

    try:
        inputs = startup_inputs_for(model, gpu)
    except ValueError as err:
        log.warning("no wake time for the simulated %s (%s): it wakes at once", model.name, err)
        return 0.0
    return timeline(StartKind.SLEEPING, inputs).seconds(Phase.ENGINE_LOADED) / model.sim.speedup


class SimHttpServer:
    """A replica's simulated engine and its HTTP server; the engine is built in `start()`.
    An `EngineServer` (engine_server.py documents each method)."""

    def __init__(self, model: ModelSpec, host: str, budget: AdmissionBudget, internal_token: str):
        self.model = model
        self.host = host
        self.budget = budget
        self.internal_token = internal_token
        self.counters = LoadCounters()
        self.engine = None
        self.metrics = SimEngineMetrics(model.name, self._gauges)
        self.url: str | None = None
        self.listener = AsgiListener()
        self.awake = AwakeGate()
        self.wake_delay_s = 0.0  # set in start() for a model whose standbys sleep
        self.kv_events: KvEventsInfo | None = None  # set in start() when the engine publishes them
        self.kv_publisher: SimKvPublisher | None = None

    async def start(self) -> str:
        from hbmserve.capacity.perf.hardware import load_catalog
        from hbmserve.capacity.perf.scenario import scenario_for
        from hbmserve.deployments.replica.sim_engine import SimEngine

        sc = scenario_for(self.model, load_catalog())
        if self.model.standbys_sleep:
            self.wake_delay_s = sim_wake_s(self.model, sc.deployment.gpu)
        # One hash per ingress block (64 characters, about 16 tokens), so cache hits line up.
        engine_cfg = replace(sc.engine, hash_block_tokens=DEFAULT_BLOCK_CHARS // BYTES_PER_TOKEN)
        routes = {}
        if publishes_kv_events(self.model):  # as a vLLM replica does (deployments/kv), from the same setting
            engine_cfg = replace(engine_cfg, publish_kv_events=True)
            self.kv_publisher = SimKvPublisher(engine_cfg.hash_block_tokens)
            routes = {EVENTS_PATH: self.kv_publisher.events, REPLAY_PATH: self.kv_publisher.replay}
        self.engine = SimEngine(sc.deployment, engine_cfg, speedup=self.model.sim.speedup,
                                startup_s=self.model.sim.startup_s,
                                kv_sink=self.kv_publisher.publish if self.kv_publisher else None)
        # The start-up delay passes before the port is bound: a replica still "loading weights"
        # must not be announced to the front door.
        await self.engine.wait_ready()
        app = build_sim_openai_app(self.engine, self.model.name, sc.engine.max_model_len, self.metrics,
                                   tuple(a.name for a in self.model.adapters), self._kv_seconds(sc))
        try:
            asgi = ReplicaMiddleware(app, self.budget, self.internal_token, self.counters, self.engine_stats,
                                     self.engine_metrics, self.awake, routes=routes, adapters=self._adapters(sc))
            self.url = await self.listener.serve(asgi, self.host)
            if self.kv_publisher is not None:
                self.kv_events = KvEventsInfo(hashing=HASHING_TEXT, block_size=engine_cfg.hash_block_tokens)
        except BaseException:
            await self.engine.shutdown()
            raise
        log.info("serving simulated %s (%s on %s, %gx) on %s", self.model.name, self.model.sim.model_config_name, self.model.sim.gpu, self.model.sim.speedup,
                 self.url)
        return self.url

    def _kv_seconds(self, sc) -> Callable[[int], float]:
        """A prompt's KV crossing `sim.kv_link` from a prefill replica like this one (the pools'
        TPs may differ; the transfer is costed at this replica's)."""
        from hbmserve.capacity.perf.perf_model import kv_transfer_s

        return lambda tokens: kv_transfer_s(sc.deployment, sc.deployment, tokens, self.model.sim.kv_link)

    def _adapters(self, sc) -> AdapterRegistry | None:
        """The registry a vLLM replica keeps, over an engine with no weights: registering is
        instant here, and the engine model charges each load's time where it lacks the adapter
        (capacity/perf/lora.py), by the same rule and slots."""
        if sc.engine.lora is None:
            return None

        async def nothing(*_: str) -> None:
            return None

        return AdapterRegistry({a.name: a.source for a in self.model.adapters}, sc.engine.lora.max_cpu_loras,
                               nothing, nothing)

    async def stop(self) -> None:
        await self.listener.stop()
        if self.engine is not None:
            await self.engine.shutdown()

    # A simulated sleep frees nothing (there is no HBM): what it models is the wake, which takes
    # the start-up timeline's wake for the GPU the engine pretends to be (sim_wake_s).
    async def sleep(self) -> None:
        pass

    async def wake_up(self) -> None:
        await asyncio.sleep(self.wake_delay_s)

    def engine_stats(self) -> EngineLoad:
        if self.engine is None:
            return EngineLoad(waiting=0, running=0, kv_usage=0.0)
        s = self.engine.stats()
        return EngineLoad(waiting=s.waiting, running=s.running, kv_usage=s.kv_usage,
                          prompt_tokens=s.prompt_tokens, prefix_hit_tokens=s.prefix_hit_tokens)

    def _gauges(self) -> GaugeStats:
        if self.engine is None:
            return GaugeStats()
        s = self.engine.stats()
        return GaugeStats(s.waiting, s.running, s.kv_usage, s.num_preemptions, s.prompt_tokens, s.prefix_hit_tokens)

    def engine_metrics(self) -> list[Metric]:
        return self.metrics.families()

    def healthy(self) -> bool:
        return self.listener.serving and self.engine is not None and self.engine.stats().ready
