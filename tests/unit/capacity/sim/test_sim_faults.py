"""Replicas lost mid-run (capacity/sim/faults.py): every request they held finishes elsewhere,
paying the re-prefill of its prompt and the tokens it had streamed."""

from __future__ import annotations

import numpy as np
import pytest

from hbmserve.capacity.sim.cluster_sim import simulate
from hbmserve.capacity.sim.faults import ReplicaFaults
from hbmserve.capacity.sim.metrics import request_latencies
from hbmserve.capacity.traces.arrivals import gamma_arrivals
from tests.unit.capacity.sim.test_cluster_sim import cluster

# Long outputs, so a loss at any moment finds streams half-way.
LOAD = gamma_arrivals(3.0, 60.0, 1.0, prompt_tokens=1500, output_tokens=400, seed=7)


def _tpot(res) -> np.ndarray:
    r = res.requests
    return request_latencies(r.arrival, r.first, r.finish, r.output)[1]


def test_every_request_a_lost_replica_held_finishes_elsewhere_paying_its_re_prefill():
    calm = simulate(cluster(3), LOAD)
    hit = simulate(cluster(3), LOAD, faults=ReplicaFaults(at_s=(20.0, 40.0), restart_s=30.0))
    assert hit.summary.finished == calm.summary.finished == len(LOAD)  # none lost
    assert hit.migrated > 0 and calm.migrated == 0
    assert hit.summary.output_tokens == calm.summary.output_tokens  # no token twice, none missing
    # The re-prefill: the streams moved prefill their prompt and what they had streamed again.
    assert hit.summary.prompt_tokens > calm.summary.prompt_tokens
    assert np.nanmax(_tpot(hit)) > np.nanmax(_tpot(calm))
    # The lost replicas' replacements came 30 s later: a fixed fleet is billed for them too.
    assert len(hit.replicas) == len(calm.replicas) + 2


def test_a_loss_after_the_trace_drained_changes_nothing_and_bad_times_are_refused():
    res = simulate(cluster(1), LOAD, faults=ReplicaFaults(at_s=(1e9,)))
    assert res.summary.finished == len(LOAD) and res.migrated == 0
    with pytest.raises(ValueError, match="restart_s"):
        ReplicaFaults(at_s=(1.0,), restart_s=-1)
