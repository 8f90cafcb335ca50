"""The contract between a Serve replica (serve_app.EngineReplica) and the engine server it owns.

An engine server is one inference engine plus the HTTP server in front of it, run on the
replica's own event loop (vllm_server.py says why no Serve proxy). Two implement it:
`VLLMHttpServer` (vllm_server.py) and `SimHttpServer` (sim_server.py, the simulated engine).
They share no base class; they conform structurally, and tests/unit/deployments/replica/test_engine_server.py
compares every member's signature with this Protocol, so a renamed method or a changed
parameter fails a test rather than a replica in a live cluster.

Life of a server, as the replica drives it:

    server = factory(model, host, internal_token)    # cheap: no engine, no socket
    url = await server.start()                       # load the engine, then listen privately
    ... server.engine_stats(), server.counters       # load reports, autoscaling stats, health
    await server.sleep(); await server.wake_up()     # a standby's sleep mode (standby_sleep.py)
    await server.stop()                              # drain, then free the engine

Everything here is called on the replica's event loop; none of it may block that loop for
long, because the same loop serves the model's HTTP traffic.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client.metrics_core import Metric

from hbmserve.core.records import KvEventsInfo
from hbmserve.deployments.replica.replica_middleware import LoadCounters
from hbmserve.deployments.replica.replica_http import AsgiListener, EngineLoad
from hbmserve.deployments.replica.standby_sleep import AwakeGate


class EngineServer(Protocol):
    """What `EngineReplica` uses of its server; nothing else may be assumed by the replica."""

    counters: LoadCounters
    """The replica middleware's per-replica counters (admitted, rejected, in flight, TTFT and
    TPOT samples, arrivals). The replica reads them for `info()` and the autoscaling stats; the
    server's middleware is their only writer."""

    listener: AsgiListener
    """The uvicorn listener on the replica's private port (only the front door connects);
    `url` is what the replica announces, `serving` whether it still listens."""

    awake: AwakeGate
    """Where the middleware holds generation requests while the engine sleeps. Open unless the
    replica's StandbySleep (standby_sleep.py) closed it; the server only passes it on."""

    kv_events: KvEventsInfo | None
    """Set by `start()` when the engine publishes its KV events through the replica's port
    (deployments/kv/engine_relay.py): how it names blocks. None: the doors route on what they
    sent it."""

    async def start(self) -> str:
        """Load the engine, then serve its OpenAI-compatible app on a private port.

        The engine must be fully loaded before the port is bound: the replica announces the
        URL to the front door as soon as this returns, and traffic may follow at once.

        Returns:
            The replica's own URL (`http://host:port`, an ephemeral port).

        Raises:
            Whatever the engine raises while loading; the server has then released what it
            started, and Serve restarts the replica.
        """
        ...

    async def stop(self) -> None:
        """Drain and shut down: stop accepting connections, let in-flight requests finish
        (up to replica_http.DRAIN_TIMEOUT_S), then free the engine. Called once, when Serve
        removes the replica; safe after a failed or partial `start()`."""
        ...

    def engine_stats(self) -> EngineLoad:
        """The engine's own load now: requests waiting, requests running and KV cache usage
        (0..1). Cheap and non-blocking (the autoscaling stats call it every push interval);
        all zeros before the engine exists."""
        ...

    def engine_metrics(self) -> list[Metric]:
        """The engine's own Prometheus families of engine_metrics.ENGINE_FAMILIES, under vLLM's
        names and labels (model_name, engine): latency histograms, token and preemption
        counters, queue and KV gauges. Served at /hbm/metrics; empty before the engine exists."""
        ...

    async def sleep(self) -> None:
        """Put the loaded engine to sleep: weights offloaded to host memory, KV freed (vLLM sleep
        mode, level 1). Called only with nothing in flight and the `awake` gate closed; the model
        must ask for it (`autoscaling.hot_standby.sleep`), so the engine was started able to.

        Raises:
            Whatever the engine raises when it cannot sleep; the standby then stays loaded.
        """
        ...

    async def wake_up(self) -> None:
        """Bring a sleeping engine back: weights to the accelerator, KV re-allocated. Returns when
        it can serve; the caller then opens the `awake` gate."""
        ...

    def healthy(self) -> bool:
        """Serve's health check: True while the engine works and the server listens. False
        once stopped or the engine failed; Serve then replaces the replica."""
        ...
