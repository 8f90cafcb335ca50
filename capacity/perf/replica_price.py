"""What one replica of a model costs an hour, from the hardware catalog: the figure the replicas
report, the front doors export and the dashboard sums."""

from __future__ import annotations

from hbmserve.capacity.perf.hardware import get_gpu, load_catalog
from hbmserve.capacity.perf.scenario import resolve_gpu_name
from hbmserve.core.config import ModelSpec
from hbmserve.core.engine_settings import EngineKind


def replica_usd_per_hour(model: ModelSpec) -> float | None:
    """What one replica of `model` costs an hour: its tp x pp GPUs at `hardware.usd_per_gpu_hour`
    or the catalog's price (`engine: sim`: the GPU it pretends to be); None when the catalog
    does not know the GPU."""
    catalog = load_catalog()
    try:
        name = resolve_gpu_name(model.sim.gpu if model.engine is EngineKind.SIM else model.hardware.gpu, catalog)
        price = get_gpu(name, catalog, model.hardware.usd_per_gpu_hour).usd_per_gpu_hour
    except ValueError:  # ScenarioError, CatalogError: an unknown GPU has no price
        return None
    return price * model.parallelism.tp * model.parallelism.pp
