"""What one replica of a model holds in Ray: the replica actor's own resources, and the bundles
Ray's node autoscaler must count for it.

Shared by the app builder (deployments/apps/options.py, which gives Serve the actor's options) and the warm
tier (deployments/control/warm_tier.py, which asks the node autoscaler for room for the same bundles), so the
two cannot count a replica differently.
"""

from __future__ import annotations

from hbmserve.core.config import ModelSpec
from hbmserve.core.engine_settings import EngineKind

def actor_options(model: ModelSpec) -> dict:
    """The replica actor's own resources: the engine's, and the model's `ray_resources` (held by
    its placement group's bundles instead where it has one: `pinned_bundles`)."""
    own = _engine_actor(model)
    if not model.ray_resources or pinned_bundles(model) is not None:
        return own
    return own | {"resources": dict(model.ray_resources)}


def _engine_actor(model: ModelSpec) -> dict:
    if model.engine is EngineKind.SIM:
        # The simulated engine is a few coroutines on the replica's event loop, mostly asleep:
        # tens of replicas must fit on two cores, and it holds no GPU unless asked to.
        gpus = model.parallelism.tp * model.parallelism.pp if model.sim.reserve_gpus else 0
        return {"num_cpus": 0, "num_gpus": gpus} if gpus else {"num_cpus": 0}
    if model.engine is EngineKind.VLLM_CPU:
        # The engine core runs in its own process and takes the cores it needs; the replica
        # actor itself mostly waits on sockets.
        return {"num_cpus": 0}
    # GPU ranks beyond the first are placed by vLLM's Ray executor inside the replica's
    # placement group (see placement/io/ray_adapter.py); the replica holds one GPU itself.
    return {"num_cpus": 1, "num_gpus": 1 if model.parallelism.tp * model.parallelism.pp == 1 else 0}


def replica_shape(model: ModelSpec) -> tuple[dict[str, float], ...]:
    """The resource bundles one replica holds, as Ray's node autoscaler must count them: the
    replica actor's own (`actor_options`), plus one GPU per rank that vLLM's Ray executor places
    beside it when the model spans several GPUs (the pinned placement group's bundles, where it
    has one)."""
    pinned = pinned_bundles(model)
    if pinned is not None:
        return tuple(pinned["placement_group_bundles"])
    opts = actor_options(model)
    own = {"CPU": float(opts.get("num_cpus", 1)), "GPU": float(opts.get("num_gpus", 0)), **model.ray_resources}
    ranks = model.parallelism.tp * model.parallelism.pp
    ranks_apart = ranks if model.engine is EngineKind.VLLM_GPU and ranks > 1 else 0
    return (own, *({"GPU": 1.0},) * ranks_apart)


def actor_holds_gpu(model: ModelSpec) -> bool:
    """Whether a planned replica's actor holds a GPU itself. A one-GPU vLLM engine runs inside the
    replica process, which must hold the GPU; every other engine's ranks (or the simulator's
    reservation) live in the placement group's bundles."""
    return model.engine is EngineKind.VLLM_GPU and model.parallelism.tp * model.parallelism.pp == 1


def pinned_bundles(model: ModelSpec) -> dict | None:
    """Serve placement-group options that keep every rank of a multi-GPU vLLM replica where its
    `ray_resources` are (a worker group): the actor alone would be pinned, and vLLM's Ray executor
    places its ranks in the replica's placement group when it has one. Bundle 0 holds the actor
    and rank 0; each bundle asks a share of the resources, so a replica takes them whole. None:
    nothing to pin, or the actor holds its only GPU itself."""
    ranks = model.parallelism.tp * model.parallelism.pp
    if not model.ray_resources or model.engine is not EngineKind.VLLM_GPU or ranks == 1:
        return None
    share = {k: v / ranks for k, v in model.ray_resources.items()}
    cpus = float(_engine_actor(model).get("num_cpus", 1))
    bundles = [{"CPU": cpus, "GPU": 1.0, **share}] + [{"GPU": 1.0, **share} for _ in range(ranks - 1)]
    # One node for a TP group; pipeline stages may span nodes of the group.
    return {"placement_group_bundles": bundles,
            "placement_group_strategy": "STRICT_PACK" if model.parallelism.pp == 1 else "PACK"}
