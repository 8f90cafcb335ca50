"""The contract between a Serve replica (serve_app.EngineReplica) and the engine server it owns.

An engine server is one inference engine plus the HTTP server in front of it, run on the
replica's own event loop (vllm_server.py says why no Serve proxy). Two implement it:
`VLLMHttpServer` (vllm_server.py) and `SimHttpServer` (sim_server.py, the simulated engine).
They share no base class; they conform structurally, and tests/unit/test_engine_server.py
compares every member's signature with this Protocol, so a renamed method or a changed
parameter fails a test rather than a replica in a live cluster.

Life of a server, as the replica drives it:

    server = factory(model, host, port, keys)       # cheap: no engine, no socket
    url = await server.start(listen=...)             # load the engine, then listen (or not)
    ... server.listener.pause() / resume()           # role changes (autoscale/roles.py)
    ... server.engine_stats(), server.counters       # autoscaling stats, info(), health
    await server.stop()                              # drain, then free the engine

Everything here is called on the replica's event loop; none of it may block that loop for
long, because the same loop serves the model's HTTP traffic.
"""

from __future__ import annotations

from typing import Protocol

from hbmserve.deployments.ingress_middleware import LoadCounters
from hbmserve.deployments.replica_http import AsgiListener, EngineLoad


class EngineServer(Protocol):
    """What `EngineReplica` uses of its server; nothing else may be assumed by the replica."""

    counters: LoadCounters
    """The ingress middleware's per-replica counters (admitted, rejected, in flight, TTFT and
    TPOT samples, arrivals). The replica reads them for `info()` and the autoscaling stats; the
    server's middleware is their only writer."""

    listener: AsgiListener
    """The uvicorn listener on the model's shared port. The replica follows the autoscaler's
    role assignment through it: `pause()` takes a demoted replica out of the port's rotation
    (in-flight requests finish), `resume()` puts a promoted one back, `serving` says which, and
    `private_url` is where a model's gate forwards held requests to this replica alone."""

    async def start(self, listen: bool = True) -> str:
        """Load the engine, then serve its OpenAI-compatible app.

        The engine must be fully loaded before the port is bound: the port is shared by all
        the model's replicas (SO_REUSEPORT), and a loading replica that listened would take its
        share of connections and hold them for the whole load.

        Args:
            listen: True to bind the model's shared port once loaded (an active replica);
                False to load the engine and prepare the app without binding (a hot standby,
                which `listener.resume()` later puts into rotation).

        Returns:
            The model's endpoint URL (`http://host:port`), the same for every replica.

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

    def healthy(self) -> bool:
        """Serve's health check: True while the engine works and the server is either
        listening or deliberately paused (a standby). False once stopped or the engine failed;
        Serve then replaces the replica."""
        ...
