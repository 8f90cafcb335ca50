"""The front door's ASGI app: one request from the client's bytes to a replica's reply.

    credential = guard.check(path, headers)             # every path but /health needs a key
    body = read_body(...)                               # size limit 413, time limit 408
    model = spec.model(body["model"])                   # unknown: 404
    gen = read_generation(path, body)                   # what the engine runs, as vLLM reads it: 400
    guard.charge(tenant, gen.most_tokens(...), doors)   # tenant rate limits, split over doors: 429
    ticket = await admission[model].enter(ask)          # queue or refuse: 429 / 503
    phase = two_phase.run(...)                          # a disaggregated model: prefill first
    for replica in choose(table.loads(model), route):   # the shared router, 1 + migration_limit tries
        relay(..., tap, ledger)                         # retried only before the first byte
    resume(ledger, ...)                                 # a broken stream goes on elsewhere (migration.py)
    admission[model].leave(ticket)
    guard.settle(tenant, charged, tap.spent(...))       # the engine's usage settles the bucket

Every refusal and proxy failure is an OpenAI-style JSON error; none is a plain-text 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from hbmserve.core.config import ClusterSpec
from hbmserve.core.routing import CHARS_PER_TOKEN, RouteRequest, Router
from hbmserve.deployments.ingress.adapter_meter import AdapterMeter
from hbmserve.deployments.ingress.front_door_access import AccessGuard, Credential, Refusal
from hbmserve.deployments.ingress.dashboard_feed import DashboardFeed
from hbmserve.deployments.ingress.door_metrics import Refusals
from hbmserve.deployments.ingress.front_door_openapi import model_card, model_list, openapi_document
from hbmserve.deployments.ingress.front_door_queue import ModelAdmission, ask_for
from hbmserve.deployments.ingress.migration import StreamLedger, resumable, with_token_ids
from hbmserve.deployments.ingress.relay import (FirstByteTimeout, NotStarted, Refused, end_broken, relay,
                                                upstream_headers, while_connected)
from hbmserve.deployments.ingress.request_body import (EMBEDDINGS, BodyError, BodyLimits, BodyShapeError, Generation,
                                                      read_body, read_generation)
from hbmserve.deployments.ingress.two_phase import DECODE, TWO_PHASE_PATHS, Phase, TwoPhase
from hbmserve.deployments.ingress.usage_tap import UsageTap, with_usage_asked
from hbmserve.routing.queue import Ask
from hbmserve.deployments.wire.chunk_push import pushing
from hbmserve.deployments.wire.http import json_response, openai_error
from hbmserve.deployments.wire.upstream import UpstreamPool
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from hbmserve.routing.choose import choose_decode
from hbmserve.routing.routers import ROUTERS
from hbmserve.routing.prefix import prompt_block_hashes, request_text

log = logging.getLogger("hbmserve.frontdoor")

# Paths relayed to a replica, chosen by the body's `model`; those that run the model go through
# admission (the replica's cap too: replica_middleware.ADMITTED_PATHS).
RUN_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/invocations", EMBEDDINGS})
MODEL_PATHS = RUN_PATHS | {"/tokenize", "/detokenize"}
REFUSED_PAUSE_S = 0.25  # between continuations that replicas refused (at their caps)
REFUSED_TRIES = 20  # then the stream ends with an error: 5 s of survivors too full to take it


async def _send_error(send, status: int, message: str, err_type: str, code: str, retry_after: int | None = None,
                      param: str | None = None):
    headers = [(b"retry-after", str(retry_after).encode())] if retry_after else []
    for msg in openai_error(status, message, err_type, code, headers, param):
        await send(msg)


def adapter_named(body: dict[str, Any], model: str) -> str | None:
    """The adapter a request for `model` names: its `model` field when that is not the base's."""
    return None if body["model"] == model else body["model"]


class FrontDoorApp:
    def __init__(self, spec: ClusterSpec, table: ReplicaTable, guard: AccessGuard,
                 admission: dict[str, ModelAdmission], session_of, token: str, limits: BodyLimits, *,
                 info_of=None, metrics_of=None, dashboard: DashboardFeed | None = None):
        self.spec = spec
        self.table = table
        self.guard = guard
        self.admission = admission
        self.session_of = session_of  # () -> the aiohttp session of the running loop (prefill)
        # The relay's own client (wire/upstream.py): the path every streamed token takes.
        self.upstream = UpstreamPool()
        self.token = token
        self.limits = limits
        self.info_of = info_of  # () -> IngressInfo as plain data (the front door's /hbm/info)
        self.metrics_of = metrics_of  # async () -> the /metrics reply (door_metrics.py)
        self.refusals = Refusals()
        self.dashboard = dashboard  # the ops dashboard's feed: serves its page, times each reply
        self.meter = AdapterMeter(spec)  # per-adapter requests, tokens and TTFT (issue 25)
        if dashboard is not None:
            dashboard.adapters_of = lambda: tuple(a for m in self.spec.models for a in self.meter.traffic(
                m.name, (r.adapters for r in self.table.replicas.get(m.name, {}).values())))
        self.openapi = openapi_document(spec)
        self.retried: dict[str, int] = {}  # model -> requests retried on another replica
        self.migrated: dict[str, int] = {}  # model -> streams that went on from another replica
        self.migration_failed: dict[str, int] = {}  # model -> broken streams that could not go on
        self.route: Router = ROUTERS[spec.serve.router]
        self.two_phase = TwoPhase(table, self.route, session_of)  # disaggregated models' prefill phase
        self._requests = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/health":
            for msg in json_response(200, {"status": "ok"}):
                await send(msg)
            return
        credential = self.guard.check(path, scope["headers"])
        if isinstance(credential, Refusal):
            await self._refuse(send, credential)
            return
        if path == "/v1/models" or path.startswith("/v1/models/"):
            await self._models(path, send)
        elif path in MODEL_PATHS:
            if scope["method"] != "POST":
                await self._error(send, 405, f"{path} takes POST", "invalid_request_error", "method_not_allowed")
                return
            await self._model_request(scope, receive, send, credential)
        elif path.startswith("/hbm/dashboard") and self.dashboard is not None:
            for msg in self.dashboard.messages(scope["method"], path):  # the page: dashboard_feed.py
                await send(msg)
        elif path == "/hbm/info" and self.info_of is not None:
            for msg in json_response(200, self.info_of()):
                await send(msg)
        elif path == "/metrics" and self.metrics_of is not None:
            body = await self.metrics_of()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode()),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        elif path == "/openapi.json":
            for msg in json_response(200, self.openapi):
                await send(msg)
        else:
            await self._error(send, 404, f"no such path: {path}", "invalid_request_error", "not_found")

    async def _error(self, send, status: int, message: str, err_type: str, code: str, retry_after: int | None = None,
                     model: str | None = None, tenant: str | None = None, param: str | None = None) -> None:
        self.refusals.note(model, code, tenant)
        await _send_error(send, status, message, err_type, code, retry_after, param)

    async def _refuse(self, send, r: Refusal, model: str | None = None, tenant: str | None = None) -> None:
        await self._error(send, r.status, r.message, r.err_type, r.code, r.retry_after_s, model, tenant)

    async def _models(self, path: str, send) -> None:
        name = path.removeprefix("/v1/models/")
        body = model_list(self.spec) if path == "/v1/models" else model_card(self.spec, name)
        if body is None:
            await self._error(send, 404, f"The model `{name}` does not exist.", "invalid_request_error",
                              "model_not_found")
            return
        for msg in json_response(200, body):
            await send(msg)

    async def _model_request(self, scope, receive, send, credential: Credential) -> None:
        path = scope["path"]
        tenant = credential.tenant.name if credential.tenant is not None else None
        try:
            raw = await read_body(scope, receive, self.limits)
        except BodyError as err:
            if err.status != 499:
                await self._error(send, err.status, str(err), "invalid_request_error", err.code, tenant=tenant)
            return
        try:
            body = json.loads(raw)
        except RecursionError:  # 400 KB of nested brackets: refused, not a 500
            await self._error(send, 400, "the request body is nested too deeply", "invalid_request_error",
                              "invalid_json", tenant=tenant)
            return
        except ValueError:
            body = None
        if not isinstance(body, dict):
            await self._error(send, 400, "the request body must be a JSON object", "invalid_request_error",
                              "invalid_json", tenant=tenant)
            return
        name = body.get("model")
        if not isinstance(name, str) or not name:
            await self._error(send, 400, "you must provide a model parameter", "invalid_request_error",
                              "missing_model", tenant=tenant)
            return
        served = self.spec.served(name)
        if served is None:  # counted without the name: a label per made-up name would have no bound
            await self._error(send, 404, f"The model `{name}` does not exist.", "invalid_request_error",
                              "model_not_found", tenant=tenant)
            return
        # An adapter runs on its base model's replicas and in its admission (they share the
        # engines); the body keeps the adapter's name, by which the engine applies it.
        model = served[0]
        if path in RUN_PATHS:
            try:
                gen = read_generation(path, body)
            except BodyShapeError as err:
                await self._error(send, 400, str(err), "invalid_request_error", "invalid_request_body",
                                  model=model.name, tenant=tenant, param=err.param)
                return
            if path != EMBEDDINGS and gen.sequences > model.engine_settings.max_num_seqs:
                await self._error(send, 400, f"{gen.sequences} sequences (n x prompts) exceed what {model.name} runs "
                                  f"at once ({model.engine_settings.max_num_seqs}, max_num_seqs)",
                                  "invalid_request_error", "too_many_sequences", model=model.name, tenant=tenant,
                                  param="n")
                return
        if path not in RUN_PATHS:  # /tokenize, /detokenize: the engine's tokenizer, not the model
            tokens = len(request_text(path, body, first_of_many=True) or "") // CHARS_PER_TOKEN
            gen = Generation(prompts=1, sequences=1, prompt_tokens=tokens, max_tokens=0, all_prompt_tokens=tokens)
        charged = gen.most_tokens(model.engine_settings.max_model_len)
        refused = self.guard.charge(credential, charged, self.table.doors, adapter=served[1])
        if refused is not None:
            if refused.code == "request_too_large" and gen.max_tokens is None:
                refused = replace(refused, message=f"{refused.message} Without max_tokens a reply may run to the end "
                                  f"of the context ({model.engine_settings.max_model_len} tokens): set max_tokens.")
            await self._refuse(send, refused, name, tenant)  # an adapter's refusals carry its name
            return
        tap = UsageTap(strip=gen.stream and not gen.stream_usage)
        raw = with_usage_asked(raw, body, gen)
        ledger = None
        if self.spec.serve.migration_limit and path in RUN_PATHS and resumable(path, body, gen):
            ledger, raw = StreamLedger(path, body), with_token_ids(raw)
        try:
            await self._admit_and_relay(scope, receive, send, model.name, raw,
                                        ask_for(credential, model, gen, asyncio.get_running_loop().time()),
                                        body, tenant, tap, ledger)
        finally:  # the bucket keeps what the engine spent, not the most the request might have
            self.guard.settle(credential, charged, tap.spent(charged, gen.all_prompt_tokens), self.table.doors,
                              served[1])
            if served[1] is not None:
                self.meter.settle(served[1].name, tap)

    async def _admit_and_relay(self, scope, receive, send, model: str, raw: bytes, ask: Ask, body: dict[str, Any],
                               tenant: str | None, tap: UsageTap, ledger: StreamLedger | None) -> None:
        send = pushing(send, scope)  # a stream's middle goes straight to the socket (relay.py)
        if scope["path"] not in RUN_PATHS:
            route = RouteRequest(ask.prompt_tokens, 0, adapter=adapter_named(body, model))
            await while_connected(receive, self._route_and_relay(scope, send, model, raw, route, tenant, tap))
            return
        gate = self.admission[model]
        if self.dashboard is not None:  # times what the client gets, for the ops dashboard
            send = self.dashboard.watch(model, send, ask.arrived_at, len(raw))
        if (adapter := adapter_named(body, model)) is not None:
            send = self.meter.watch(adapter, send, ask.arrived_at, len(raw))

        async def admitted() -> None:
            ticket = await gate.enter(ask)
            if isinstance(ticket, Refusal):
                await self._refuse(send, ticket, model, tenant)
                return
            try:
                route, precise = self._route_request(scope["path"], model, body, ask)
                await self._route_and_relay(scope, send, model, raw, route, tenant, tap, ledger, precise, body)
            finally:
                gate.leave(ticket)

        # A client that leaves cancels both steps: a queued place is given back at once (enter's
        # cancellation), a relayed request is aborted in its engine.
        await while_connected(receive, admitted())

    def _route_request(self, path: str, model: str, body: dict[str, Any], ask: Ask) -> tuple[RouteRequest, bool]:
        """The request as the router sees it, and whether its prefix hashes are the engines' own
        (the model's engines publish KV events and the door could tokenize it exactly), so that
        replicas are scored on what they report holding; else the approximate text hashes."""
        self._requests += 1  # the salt of choose's power-of-two draw: spreads ties, reproducibly
        exact = self.table.kv.hashes(model, path, body) if self.table.kv is not None else None
        hashes = exact if exact is not None else prompt_block_hashes(request_text(path, body, first_of_many=True) or "")
        return RouteRequest(ask.prompt_tokens, ask.max_tokens, prefix_hashes=hashes, salt=self._requests,
                            adapter=adapter_named(body, model)), exact is not None

    def _ranked(self, model: str, phase: Phase, precise: bool) -> tuple[str, ...]:
        """The replicas for the phase's reply, best first: a decode replica with room for the KV
        (routing.choose_decode), or any replica by the router."""
        if phase.role == DECODE:
            return choose_decode(self.route, self.table.loads(model, role=DECODE), phase.route).ranked
        return self.route(self.table.loads(model, precise), phase.route).ranked

    async def _route_and_relay(self, scope, send, model: str, raw: bytes, route: RouteRequest,
                               tenant: str | None, tap: UsageTap, ledger: StreamLedger | None = None,
                               precise: bool = False, body: dict[str, Any] | None = None) -> None:
        """Relay the request to the best replica, the next while they fail before a byte; a
        disaggregated model's prompt first runs on its prefill pool (two_phase.py)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        query = scope.get("query_string", b"").decode("latin-1")
        suffix = scope["path"] + (f"?{query}" if query else "")
        headers = upstream_headers(scope["headers"], self.token, route.adapter)
        tried: list[str] = []
        failure = "no active replica"
        # The first replica, then others while replicas fail before any byte: once, or as many
        # times as a broken stream may move (a reply not streamed starts over: none of it was sent).
        attempts = 1 + max(1, self.spec.serve.migration_limit)
        phase = Phase(None, raw, route, "")
        if body is not None and scope["path"] in TWO_PHASE_PATHS and self.spec.model(model).disaggregation:
            phase = await self.two_phase.run(model, suffix, headers, body, raw, route, precise,
                                             self.limits.first_byte_timeout_s)
        for _ in range(attempts):
            ranked = [rid for rid in self._ranked(model, phase, precise) if rid not in tried]
            if not ranked and phase.role == DECODE:  # no decode replica left: the whole request elsewhere
                phase = self.two_phase.aggregated(model, raw, route, failure)
                ranked = [rid for rid in self._ranked(model, phase, precise) if rid not in tried]
            replica = self.table.get(model, ranked[0]) if ranked else None
            if replica is None:
                break
            tried.append(replica.endpoint.replica)
            replica.sent_since_poll += 1
            if not precise:  # what the engine holds comes from its events, not from what was sent
                replica.remember(phase.route.prefix_hashes)
            tap.forwarded = True
            try:
                done = await relay(self.upstream, replica.endpoint.url + suffix, scope["method"], headers, phase.raw,
                                   send, self.limits.first_byte_timeout_s, started, replica.endpoint.replica, tap,
                                   ledger, streams=replica.streams)
                if done.left_open:
                    await self._resume(send, model, route, headers, tap, ledger, tried, precise)
                return
            except NotStarted as err:
                failure = f"replica {replica.endpoint.replica} failed before answering ({err})"
                log.warning("%s: %s; %s", model, failure, "retrying on another replica" if len(tried) < attempts
                            else "giving up")
                self.table.mark_unreachable(model, replica.endpoint.replica)
                if len(tried) < attempts:
                    self.retried[model] = self.retried.get(model, 0) + 1
            except FirstByteTimeout:
                await self._error(send, 504, f"replica {replica.endpoint.replica} of {model} sent nothing within "
                                  f"{self.limits.first_byte_timeout_s:g}s", "server_error", "upstream_timeout",
                                  model=model, tenant=tenant)
                return
        status = 503 if not tried else 502
        await self._error(send, status, f"{model}: {failure}", "server_error",
                          "no_replica" if status == 503 else "replica_failed", retry_after=1, model=model,
                          tenant=tenant)

    async def _resume(self, send, model: str, route: RouteRequest, headers: dict[str, str], tap: UsageTap,
                      ledger: StreamLedger, tried: list[str], precise: bool) -> None:
        """Go on with a broken stream from another replica (migration.py), up to the migration
        limit of replicas that break; one whose cap refuses the continuation is asked again
        after a pause. Ends the client's response either way."""
        loop = asyncio.get_running_loop()
        limit, refusals = self.spec.serve.migration_limit, 0
        self.table.mark_unreachable(model, tried[-1])
        while ledger.migrations < limit and refusals < REFUSED_TRIES:
            ranked = [rid for rid in self.route(self.table.loads(model, precise), route).ranked if rid not in tried]
            replica = self.table.get(model, ranked[0]) if ranked else None
            if replica is None:
                break
            name = replica.endpoint.replica
            replica.sent_since_poll += 1
            try:
                done = await relay(self.upstream, replica.endpoint.url + "/v1/completions", "POST", headers,
                                   ledger.continuation_body(), send, self.limits.first_byte_timeout_s, loop.time(),
                                   tap=tap, ledger=ledger, resumed=True, streams=replica.streams)
            except Refused:
                refusals += 1
                await asyncio.sleep(REFUSED_PAUSE_S)
                continue
            except (NotStarted, FirstByteTimeout) as err:
                log.warning("%s: a continuation on replica %s failed (%s)", model, name, err)
                done = None
            ledger.migrations += 1
            tried.append(name)
            if done is not None and done.completed:
                self.migrated[model] = self.migrated.get(model, 0) + 1
                log.info("%s: a stream went on from replica %s, %d tokens in all", model, name, len(ledger.sent))
                return
            if done is not None and not done.left_open:  # relay ended it with an error event
                self.migration_failed[model] = self.migration_failed.get(model, 0) + 1
                return
            self.table.mark_unreachable(model, name)
        self.migration_failed[model] = self.migration_failed.get(model, 0) + 1
        await end_broken(send, tap, True, f"the replicas serving this request failed mid-stream "
                         f"{ledger.migrations + 1} times (migration limit {limit}); the reply is incomplete")
