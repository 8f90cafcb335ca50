"""The door's admission (deployments/ingress/front_door_queue.py): the pace (`ModelAdmission._pace`),
Little's law over the median time a request held its slot in the last 30 s, recomputed at most
every _PACE_REFRESH_S rather than sorted again on every request; and what each replica is sent."""

from __future__ import annotations

from hbmserve.core.config import parse_cluster_spec
from hbmserve.deployments.ingress.front_door_queue import _PACE_REFRESH_S, _PACE_WINDOW_S, ModelAdmission
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from hbmserve.core.records import ReplicaEndpoint
from hbmserve.routing.queue import Admit, Ask, Enqueue, Waiting, admit

MODEL = parse_cluster_spec({"models": [{"name": "m", "source": "sim", "engine": "sim", "replicas": 1,
                                        "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b"}}]}).models[0]


def _served(adm: ModelAdmission, clock: list[float], start: float, held: float) -> None:
    ask = Ask(tenant="t", priority=0, sequences=1, prompt_tokens=10, max_tokens=10, arrived_at=start)
    clock[0] = start
    adm._charge(ask, start)
    clock[0] = start + held
    adm.leave(ask)


def test_the_pace_is_the_median_hold_and_refreshes_on_its_period():
    clock = [0.0]
    adm = ModelAdmission(MODEL, ReplicaTable(["m"], set()), clock=lambda: clock[0])
    assert adm._pace(0.0, 8) is None  # no samples yet
    for held in (1.0, 2.0, 4.0):
        _served(adm, clock, 0.0, held)
    assert adm._pace(4.0, 8) == 8 / 2.0  # the median of 1, 2, 4
    _served(adm, clock, 4.0, 4.0)  # holds 1, 2, 4, 4: the median moves to 4
    _served(adm, clock, 4.0, 4.0)
    assert adm._pace(4.0 + _PACE_REFRESH_S / 2, 8) == 8 / 2.0  # not yet recomputed
    assert adm._pace(4.0 + _PACE_REFRESH_S, 8) == 8 / 4.0
    assert adm._pace(4.0 + _PACE_REFRESH_S, 0) is None  # nothing active: no pace
    # Past the window every sample has aged out: no pace until new ones come.
    assert adm._pace(9.0 + _PACE_WINDOW_S, 8) is None


def _routable(n: int, max_num_seqs: int) -> ModelAdmission:
    spec = parse_cluster_spec({"models": [{
        "name": "m", "source": "sim", "engine": "sim", "replicas": n,
        "engine_settings": {"max_num_seqs": max_num_seqs},
        "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b"}}]}).models[0]
    table = ReplicaTable(["m"], set())
    table.update([ReplicaEndpoint(app="m", deployment="d", replica=f"r{i}", model="m", url=f"http://127.0.0.1:{9000 + i}",
                                  node_id="n", at=0.0) for i in range(n)], {})
    for r in table.replicas["m"].values():
        r.reachable = True
    return ModelAdmission(spec, table, clock=lambda: 0.0)


def test_each_replica_is_sent_its_batch_and_the_hand_off_beyond_it():
    """The engine's own queue holds the next request when a sequence finishes (HANDOFF_DIVISOR):
    32 + 4 per replica, 8 + 1, none on batches under 8; the door queues the rest."""
    one, two, small = _routable(1, 32).capacity(0.0), _routable(2, 8).capacity(0.0), _routable(2, 4).capacity(0.0)
    assert (one.active_sequences, two.active_sequences, small.active_sequences) == (36, 18, 8)
    # Taken from the queue's room: the door accepts 4 batches per replica in all, as before.
    assert [c.active_sequences + c.queue_sequences for c in (one, two, small)] == [128, 64, 32]
    adm = _routable(1, 8)
    asks = [Ask(tenant="t", priority=0, sequences=1, prompt_tokens=10, max_tokens=10, arrived_at=0.0) for _ in range(10)]
    for a in asks[:9]:
        assert isinstance(admit(a, adm.capacity(0.0), Waiting(), 0.0), Admit)
        adm._charge(a, 0.0)
    assert isinstance(admit(asks[9], adm.capacity(0.0), Waiting(), 0.0), Enqueue)  # the 10th waits at the door
