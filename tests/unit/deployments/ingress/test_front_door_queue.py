"""The door's admission pace (deployments/ingress/front_door_queue.py `ModelAdmission._pace`):
Little's law over the median time a request held its slot in the last 30 s, recomputed at most
every _PACE_REFRESH_S rather than sorted again on every request."""

from __future__ import annotations

from hbmserve.core.config import parse_cluster_spec
from hbmserve.deployments.ingress.front_door_queue import _PACE_REFRESH_S, _PACE_WINDOW_S, ModelAdmission
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from hbmserve.routing.queue import Ask

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
