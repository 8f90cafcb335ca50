"""The replica table's view of a draining replica (one a rollout or a scale-down stops): out of
rotation at once, its streams relayed on while it drains, cut only when its announcement ends."""

from __future__ import annotations

import asyncio
import socket
import time

from hbmserve.core.records import ReplicaEndpoint
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from hbmserve.deployments.wire.upstream import UpstreamPool


class Reply:
    """Stands in for an upstream reply being relayed: the table only closes it."""

    closed = False

    def close(self) -> None:
        self.closed = True


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once closed: a poll there is refused


def _endpoint(replica: str, port: int, draining: bool = False) -> ReplicaEndpoint:
    return ReplicaEndpoint(app="m", deployment="engine-m", replica=replica, model="m",
                           url=f"http://127.0.0.1:{port}", node_id="n", at=time.time(), draining=draining)


def test_a_draining_replica_takes_nothing_new_and_keeps_its_streams_until_it_is_withdrawn():
    async def run():
        table = ReplicaTable(["m"], set(), lost_after_s=0.0)
        port = _closed_port()
        table.update([_endpoint("a", port), _endpoint("b", port)], {})
        assert {r.endpoint.replica for r in table.replicas["m"].values() if r.active} == {"a", "b"}
        streams = {rid: Reply() for rid in "ab"}
        for rid, reply in streams.items():
            table.get("m", rid).streams.add(reply)
        table.update([_endpoint("a", port, draining=True), _endpoint("b", port)], {})
        assert not table.get("m", "a").active and table.get("m", "b").active
        client = UpstreamPool()
        for _ in range(2):  # both refuse polls, past lost_after_s: only the live one is lost
            await table.poll(client, "token")
        await client.close()
        assert streams["b"].closed and not streams["a"].closed
        table.update([_endpoint("b", port)], {})  # the drain is over: withdrawn
        assert streams["a"].closed and table.get("m", "a") is None

    asyncio.run(run())
