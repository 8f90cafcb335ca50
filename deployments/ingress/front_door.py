"""The front door: one per node, every model of the cluster on one port.

A Serve deployment (application `hbmserve-frontdoor`, built by deployments/apps/service_apps.py) with one replica per node (max_replicas_per_node=1),
each serving `serve.http.host:serve.http.port` so that a load balancer or a Kubernetes Service
can spread clients over nodes. Each front door reaches every model's replicas on any node
(replica_table.py), authenticates (front_door_access.py), admits (front_door_queue.py), routes
with the shared `routing.choose` and relays (front_door_app.py, relay.py). Its `/metrics`
(admin token) is the Prometheus view of its node (door_metrics.py).

Three loops keep its picture fresh: discovery (replica endpoints and the autoscaler's active
lists, every DISCOVER_S), load polling (every replica_table.POLL_S, which also releases queued
requests when capacity appears), and held counts for scale from zero (every RENEW_S while
requests are held, read by the autoscaling policy). A fourth samples the ops dashboard
(dashboard_feed.py) every dashboard.SAMPLE_S, and with auth on a fifth reloads the key files
when they change (KeyFiles.RELOAD_S).
"""

from __future__ import annotations

import asyncio
import logging
import time

from hbmserve.autoscale.rollout import deploy_changes
from hbmserve.core.config import ClusterSpec
from hbmserve.core.records import DoorEndpoint
from hbmserve.core.door_records import IngressInfo, ModelTraffic
from hbmserve.deployments.ingress.door_metrics import GpuCollector, door_families, local_replicas, node_metrics
from hbmserve.capacity.perf.scenario import replica_usd_per_hour
from hbmserve.deployments.ingress.dashboard import SAMPLE_S
from hbmserve.deployments.ingress.dashboard_feed import DashboardFeed
from hbmserve.deployments.ingress.front_door_access import AccessGuard, KeyFiles, reload_keys
from hbmserve.deployments.ingress.front_door_app import FrontDoorApp
from hbmserve.deployments.ingress.request_body import BodyLimits
from hbmserve.deployments.ingress.front_door_queue import ModelAdmission
from hbmserve.deployments.kv.door_kv import DoorKv, kv_routing
from hbmserve.deployments.wire.http import INTERNAL_TOKEN_HEADER
from hbmserve.deployments.wire.hardened_http import HardenedServer, HttpLimits, listen_socket
from hbmserve.deployments.wire.records_store import (RENEW_S, info_reply, latest_decision, latest_deployed, live_doors,
                                                     live_endpoints, publish_demand, publish_door, remove_door)
from hbmserve.deployments.ingress.replica_table import POLL_S, ReplicaTable
from hbmserve.deployments.wire.names import engine_pools, pool_prices

log = logging.getLogger("hbmserve.frontdoor")

DISCOVER_S = 0.5


class FrontDoor:
    async def __init__(self, spec_json: str, internal_token: str):
        import aiohttp
        import ray

        self.spec, self._spec_json = ClusterSpec.model_validate_json(spec_json), spec_json
        http = self.spec.serve.http
        auth = self.spec.serve.auth
        self.keys = KeyFiles(auth) if auth is not None else None
        self.guard = AccessGuard(self.keys.ring() if self.keys else None)  # raises: fail closed
        names = [m.name for m in self.spec.models]
        # The engines' KV events, one stream per publishing replica (deployments/kv/door_kv.py).
        self.kv = DoorKv({INTERNAL_TOKEN_HEADER.decode(): internal_token}, lambda: self.session)
        self.table = ReplicaTable(names, {key for key, (_, pool) in self._pools() if pool.autoscaling is not None},
                                  kv=self.kv)
        self.admission = {m.name: ModelAdmission(m.serving(), self.table) for m in self.spec.models}
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True),
            auto_decompress=False)
        self.dashboard = DashboardFeed(self.spec, self.table, self.admission,
                                       lambda: (self.node_id, self.table.doors, self.guard.enforced))
        self.app = FrontDoorApp(self.spec, self.table, self.guard, self.admission, lambda: self.session,
                                internal_token, BodyLimits(http.max_body_bytes, http.body_timeout_s,
                                                           http.first_byte_timeout_s),
                                info_of=lambda: info_reply(self._info()), metrics_of=self._metrics,
                                dashboard=self.dashboard)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.prices = pool_prices(self.spec.models, replica_usd_per_hour)  # by pool: a pool's TP prices it
        self.gpus = GpuCollector.open()
        self.holder = f"{self.node_id[:12]}-{id(self):x}"
        self._demand: dict[str, bool] = {}  # model -> demand published nonzero last time
        public, own = listen_socket(http.host, http.port, shared=True), listen_socket(http.host, 0, shared=False)
        self.url = f"http://{http.host}:{http.port}"
        self.own_url = "http://{}:{}".format(*own.getsockname()[:2])
        await self._renew()
        await self._discover()
        self.server = HardenedServer(self.app, HttpLimits.of(http),
                                     on_refused=lambda code: self.app.refusals.note(None, code, None))
        await self.server.start([public, own])
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._every(DISCOVER_S, self._discover)),
                       loop.create_task(self._every(POLL_S, self._poll)),
                       loop.create_task(self._every(RENEW_S / 2, self._renew)),
                       loop.create_task(self._every(SAMPLE_S, self.dashboard.refresh))]
        if self.keys is not None:
            self._tasks.append(loop.create_task(self._every(KeyFiles.RELOAD_S, self._reload_keys)))
        log.info("front door on %s (this one alone: %s), auth %s, %d model(s)", self.url, self.own_url,
                 "enforced" if self.guard.enforced else "off", len(names))

    async def _every(self, period_s: float, step) -> None:
        while True:
            try:
                await step()
            except Exception:  # noqa: BLE001 - a KV or network hiccup must not stop the loop
                log.warning("front door loop %s failed; retrying", step.__name__, exc_info=True)
            await asyncio.sleep(period_s)

    async def _discover(self) -> None:
        def read():
            decisions = {key: latest_decision(pool.name, deployment) for key, (deployment, pool) in self._pools()
                         if pool.autoscaling is not None}
            return live_endpoints(), decisions, live_doors(), latest_deployed()

        endpoints, decisions, doors, deployed = await asyncio.to_thread(read)
        self.table.update(endpoints, decisions)
        self.table.doors = max(1, len(doors))
        if deployed is not None and deployed.spec_json != self._spec_json:
            self._adopt(deployed.spec_json)

    def _pools(self):
        """(pool_key, (engine deployment, the pool as a model)) of every model's scaling groups."""
        return [item for m in self.spec.models for item in engine_pools(m).items()]

    def _adopt(self, spec_json: str) -> None:
        """Take the model sections a rollout finished (cluster/rolling_deploy.py publishes them
        once every replica runs the new version): admission, /v1/models and prices follow the
        new engine settings without restarting this door. Any other change is a full redeploy,
        which replaces this door anyway."""
        spec, self._spec_json = ClusterSpec.model_validate_json(spec_json), spec_json
        if deploy_changes(self.spec, spec).full_reason is not None:
            return
        changed = [m.name for m in spec.models if m != self.spec.model(m.name)]
        self.spec = self.app.spec = self.dashboard.spec = spec
        self.app.meter.update(spec)
        for m in spec.models:
            self.admission[m.name].model = m.serving()
        self.prices = self.dashboard.prices = pool_prices(spec.models, replica_usd_per_hour)
        log.info("front door took the new section of %s", ", ".join(changed) or "no model")

    async def _reload_keys(self) -> None:
        await reload_keys(self.keys, self.guard)

    async def _poll(self) -> None:
        await self.table.poll(self.app.upstream, self.app.token)
        for gate in self.admission.values():
            gate.pump()

    async def _renew(self) -> None:
        """This front door's announcement, and per model the demand no replica sees."""
        door = DoorEndpoint(door=self.holder, node_id=self.node_id, url=self.own_url, at=time.time())
        await asyncio.to_thread(publish_door, door)
        for m in self.spec.models:
            gate = self.admission[m.name]
            demand = (gate.queued, gate.refused_rps())
            if any(demand) or self._demand.get(m.name):
                for deployment, _ in engine_pools(m).values():  # both pools of a disaggregated model
                    await asyncio.to_thread(publish_demand, m.name, deployment, self.holder, *demand)
            self._demand[m.name] = any(demand)

    async def _metrics(self) -> bytes:
        local = local_replicas(self.table, self.node_id)
        own = door_families(self.app.refusals, {name: a.queued for name, a in self.admission.items()}, local,
                            self.prices, {m.name: m.slo for m in self.spec.models},
                            {"resumed": self.app.migrated, "failed": self.app.migration_failed}, self.kv.reports(),
                            self.app.two_phase.outcomes)
        own += self.app.meter.families((r.endpoint.model, r.adapters) for r in local)
        return await node_metrics(self.session, self.app.token, local, own,
                                  self.gpus.collect if self.gpus is not None else None)

    def _info(self) -> IngressInfo:
        import psutil

        kv, local = self.kv.reports(), local_replicas(self.table, self.node_id)
        models = tuple(ModelTraffic(model=name, accepted=a.accepted, rejected=a.rejected,
                                    in_flight=a.in_flight_sequences + a.queued, queued=a.queued,
                                    routable=self.table.routable(name), retried=self.app.retried.get(name, 0),
                                    migrated=self.app.migrated.get(name, 0),
                                    migration_failed=self.app.migration_failed.get(name, 0),
                                    kv=kv_routing(kv[name]) if name in kv else None,
                                    adapters=self.app.meter.traffic(name, (r.adapters for r in local
                                                                           if r.endpoint.model == name)),
                                    **self._pools_traffic(name))
                       for name, a in self.admission.items())
        return IngressInfo(node_id=self.node_id, url=self.url, own_url=self.own_url, auth=self.guard.enforced,
                           connections=self.server.connections,
                           rss_mib=round(psutil.Process().memory_info().rss / 2**20, 1), models=models)

    def _pools_traffic(self, name: str) -> dict:
        """A disaggregated model's prefill pool and two-phase outcomes, for ModelTraffic."""
        if self.spec.model(name).disaggregation is None:
            return {}
        return {"prefill_routable": self.table.routable(name, "prefill"),
                "two_phase": tuple(sorted(self.app.two_phase.outcomes.get(name, {}).items()))}

    async def info(self) -> dict:
        return info_reply(self._info())

    async def check_health(self) -> None:
        if not self.server.serving:
            raise RuntimeError("the front door's HTTP server stopped")

    async def __del__(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.to_thread(remove_door, DoorEndpoint(door=self.holder, node_id=self.node_id, url=self.own_url,
                                                          at=0.0))
        await self.server.stop()
        await self.kv.close()
        for m in self.spec.models:  # let go of the demand at once rather than at its TTL
            if self._demand.get(m.name):
                for deployment, _ in engine_pools(m).values():
                    await asyncio.to_thread(publish_demand, m.name, deployment, self.holder, 0, 0.0)
        await self.session.close()
        await self.app.upstream.close()
        if self.gpus is not None:
            self.gpus.close()
