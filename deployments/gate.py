"""A model's gate: what answers on the model's port while no replica does (scale to zero).

Replicas serve HTTP themselves (vllm_server.py says why), so at zero replicas nothing would
listen and clients would get "connection refused". A model whose `autoscaling.min_replicas` is
0 therefore gets one more, tiny Serve deployment in its application, the gate (no CPU, no GPU):

* It listens on the model's shared port only while the policy has no active replica, and
  leaves the port to the replicas a moment after one is assigned (replicas bind within one
  role poll, serve_app.ROLE_POLL_S).
* `/v1/models` is answered from the config, so clients still see the model while it sleeps.
* A generation request is held: the count goes to the autoscaling policy (records_store.
  publish_held -> Snapshot.pending_at_ingress), which scales up from zero at once. When an
  active replica is up, the request is forwarded to that replica's private address (never to
  the shared port, which could be the gate itself) and streamed back.
* Past `scale_from_zero_wait_s`, the request gets a 503 with Retry-After and an OpenAI-style
  error body, so the client knows to come back rather than wait forever.
* Held requests are admitted by the same AdmissionBudget as a replica's: a burst larger than
  one replica's queue gets 429 + Retry-After instead of waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

from hbmserve.core.config import AuthSpec, ModelSpec
from hbmserve.core.records import GateInfo
from hbmserve.core.scaling import ReplicaState
from hbmserve.routing.admission import AdmissionBudget
from hbmserve.deployments.ingress_middleware import (IngressMiddleware, LoadCounters, json_response,
                                                     load_key_ring, openai_error)
from hbmserve.deployments.records_store import (info_reply, latest_decision, publish_held,
                                                 read_replica_info)
from hbmserve.deployments.replica_http import AsgiListener

log = logging.getLogger("hbmserve.gate")

POLL_S = 0.2
# How long replicas must have been assigned before the gate gives up the port: several role
# polls, so the replica has bound it and no connection meets a closed port.
HANDOVER_S = 1.0
_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"host", b"upgrade", b"te", b"trailer"}


class ModelGate:
    """The Serve deployment class (one replica per scale-to-zero model)."""

    async def __init__(self, model_json: str, host: str, port: int, auth: AuthSpec | None,
                       engine, engine_deployment: str, max_held: int):
        from ray import serve

        self.model = ModelSpec.model_validate_json(model_json)
        self.engine = engine  # DeploymentHandle of the model's engine deployment
        self.app_name = serve.get_replica_context().app_name
        self.engine_deployment = engine_deployment
        self.wait_s = self.model.autoscaling.scale_from_zero_wait_s
        self.held = 0
        self._active: list[str] = []
        self._active_since: float | None = None
        self._urls: dict[str, str] = {}  # replica id -> private URL, for active replicas
        self.counters = LoadCounters()
        asgi = IngressMiddleware(self._app, AdmissionBudget(max_in_flight=max_held), load_key_ring(auth),
                                 self.counters)
        self.listener = AsgiListener()
        self.url = self.listener.prepare(asgi, host, port)
        import httpx

        self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))
        await self._sync()
        self._watch = asyncio.get_running_loop().create_task(self._watch_loop())

    # -- following the policy -------------------------------------------------------------
    def _read_active(self) -> list[str]:
        decision = latest_decision(self.app_name, self.engine_deployment)
        return list(decision.active_replicas) if decision else []

    async def _sync(self) -> None:
        active = await asyncio.to_thread(self._read_active)
        now = time.monotonic()
        if active and not self._active:
            self._active_since = now
        self._active = active
        self._urls = {r: u for r, u in self._urls.items() if r in active}
        if not active:
            self._active_since = None
            if not self.listener.serving:
                await self.listener.resume()
                log.info("%s has no active replica: the gate listens on %s", self.model.name, self.url)
        elif self.listener.serving and now - self._active_since >= HANDOVER_S:
            self.listener.pause()
            log.info("%s is served by %d replica(s): the gate leaves the port", self.model.name, len(active))

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self._sync()
            except Exception:  # noqa: BLE001 - a KV hiccup must not kill the gate; retry next poll
                log.warning("gate could not read the autoscaler's decision", exc_info=True)

    def _publish_held(self) -> None:
        publish_held(self.app_name, self.engine_deployment, self.held)

    async def _replica_url(self) -> str | None:
        """A private URL of an active replica, or None if there is none yet."""
        for replica in self._active:
            if replica in self._urls:
                return self._urls[replica]
        if not self._active:
            return None
        # The handle picks a running replica (active or standby); ask until an active one answers.
        with contextlib.suppress(asyncio.TimeoutError):
            info = read_replica_info(await asyncio.wait_for(self.engine.info.remote(), timeout=2.0))
            if info.role is ReplicaState.ACTIVE and info.private_url:
                self._urls[info.replica] = info.private_url
                return info.private_url
        return None

    # -- HTTP -----------------------------------------------------------------------------
    async def _app(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        if path == "/v1/models":
            card = {"id": self.model.name, "object": "model", "created": 0, "owned_by": "hbmserve",
                    "root": self.model.name, "parent": None,
                    "max_model_len": self.model.engine_settings.max_model_len}
            for msg in json_response(200, {"object": "list", "data": [card]}):
                await send(msg)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await self._hold_and_forward(scope, body, send)

    async def _hold_and_forward(self, scope, body: bytes, send) -> None:
        import httpx

        deadline = time.monotonic() + self.wait_s
        self.held += 1
        await asyncio.to_thread(self._publish_held)
        try:
            while time.monotonic() < deadline:
                url = await self._replica_url()
                if url is None:
                    await asyncio.sleep(POLL_S)
                    continue
                try:
                    await self._forward(url, scope, body, send)
                    return
                except httpx.ConnectError:
                    # Demoted or stopped between lookup and connect; nothing was sent yet.
                    self._urls = {r: u for r, u in self._urls.items() if u != url}
        finally:
            self.held -= 1
            await asyncio.to_thread(self._publish_held)
        retry = max(1, math.ceil(self.model.autoscaling.startup_s.warm))
        log.warning("%s: no replica ready within %.0fs; answered 503", self.model.name, self.wait_s)
        message = (f"model {self.model.name} is scaling up from zero and no replica was ready within "
                   f"{self.wait_s:g}s; retry after {retry}s")
        for msg in openai_error(503, message, "service_unavailable", "scaling_from_zero",
                                [(b"retry-after", str(retry).encode())]):
            await send(msg)

    async def _forward(self, url: str, scope, body: bytes, send) -> None:
        query = scope.get("query_string", b"").decode()
        target = url + scope["path"] + (f"?{query}" if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP | {b"content-length"}]
        request = self._client.build_request(scope["method"], target, headers=headers, content=body)
        response = await self._client.send(request, stream=True)
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    # -- Serve ------------------------------------------------------------------------------
    async def info(self) -> dict:
        """A GateInfo as plain data (records_store.read_gate_info types it again)."""
        return info_reply(GateInfo(model=self.model.name, url=self.url, listening=self.listener.serving,
                                   held=self.held, accepted=self.counters.accepted,
                                   rejected=self.counters.rejected, active_replica_count=len(self._active)))

    async def __del__(self) -> None:
        self._watch.cancel()
        await self.listener.stop()
        await self._client.aclose()
