"""A small cluster for the evaluation's tests: the reference model, 1-4 replicas, a 60 s cold
start, so that every policy, the oracle and the whole static frontier replay in seconds."""

from __future__ import annotations

from importlib import resources

import pytest

from hbmserve.capacity.sim.evaluate import load_eval_cluster


@pytest.fixture(scope="session")
def small_cluster(tmp_path_factory):
    text = resources.files("hbmserve.capacity.sim").joinpath("data", "reference_cluster.yaml").read_text()
    text = text.replace("max_replicas: 16", "max_replicas: 4").replace(
        "target_queue_per_replica: 4",
        "target_queue_per_replica: 4\n      startup_s: {hot: 5, warm: 20, cold: 60}")
    path = tmp_path_factory.mktemp("small") / "small.yaml"
    path.write_text(text)
    return load_eval_cluster(path)
