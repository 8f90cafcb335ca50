"""The start-up model's inputs for a configured model: measured figures where they exist.

    startup_inputs_for(model, catalog) -> StartupInputs
    startup_estimate(model, catalog) -> {Tier: seconds}    the policy's default `startup_s`

`capacity/perf/data/startup_measured.json` holds what ops/bench/cold_start.py measured live (vLLM-CPU,
per tier, per phase) and what ops/bench/weight_load.py measured of the disk and the safetensors
loader. A vLLM-CPU model takes every fixed cost from it; its bytes come from its own size. A GPU
model (vllm-gpu, or the simulated engine pretending to be one) takes its bytes from the model
shape, the promotion from the live measurement (the front door's, not the engine's), the
loader's efficiency from the disk bench, and the rest from assumptions labelled in
`StartupInputs.sources`: no GPU was lent to this project, so nothing of a GPU start is measured.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from hbmserve.capacity.perf.hardware import GpuProfile
from hbmserve.capacity.perf.scenario import shape_for
from hbmserve.capacity.perf.startup_timeline import StartupInputs, startup_s
from hbmserve.core.config import ModelSpec
from hbmserve.core.engine_settings import EngineKind
from hbmserve.core.scaling import Tier

MEASURED_FILE = "startup_measured.json"

# Assumed, not measured here: the reference figures and round numbers for a GPU node.
ASSUMED_SOURCE_GBPS = 25 / 8  # 25 Gb/s from the object store (issue 11's reference)
ASSUMED_NVME_GBPS = 3.0  # the slow end of the 3-7 GB/s NVMe
ASSUMED_NODE_READY_S = 120.0  # a cloud GPU node provisioned and joined to Ray
ASSUMED_GPU_ENGINE_INIT_S = 30.0  # vLLM on GPU besides the weights: profile, KV, CUDA graphs
ASSUMED_GPU_FIRST_TOKEN_S = 0.1  # an idle engine's first token for a short prompt
ASSUMED_WAKE_FIXED_S = 1.0  # vLLM wake_up besides the copy: KV re-allocated, prefix cache reset
ASSUMED_WAKE_EFFICIENCY = 0.8  # share of the host link's datasheet bandwidth a pinned copy gets


def load_measured() -> dict[str, Any] | None:
    """The checked-in measurements (package data, like capacity/perf/data/hardware.yaml); None when
    nothing was measured (the file is absent)."""
    path = resources.files("hbmserve.capacity.perf").joinpath("data", MEASURED_FILE)
    return json.loads(path.read_text()) if path.is_file() else None


def _cpu_inputs(weights_bytes: float, measured: dict[str, Any]) -> StartupInputs:
    tiers, disk = measured["tiers"], measured["disk"]
    cold, warm, hot = tiers["cold"], tiers["warm"], tiers["hot"]
    idle_first = max(0.0, warm["first_token_s"] - warm["serving_s"])
    # The measured model is small, so its fetch is mostly latency; its effective rate is what a
    # model of that size sees, and the best figure there is for another.
    source_gbps = measured["model_bytes"] / max(cold["weights_local_s"], 1e-3) / 1e9
    own = measured["model_bytes"] / (disk["gbps"] * disk["load_efficiency"] * 1e9)
    tag = f"measured ({measured['_source']})"
    # Everything from the deploy call to serving that is not reading the bytes: the replica
    # actor, the engine's own start, the front door finding it.
    return StartupInputs(
        weights_bytes=weights_bytes, source_gbps=source_gbps, disk_gbps=disk["gbps"],
        load_efficiency=disk["load_efficiency"], node_ready_s=0.0,
        engine_init_s=max(0.0, warm["serving_s"] - own), promote_s=max(0.0, hot["first_token_s"] - idle_first),
        first_token_s=idle_first,
        sources={"source_gbps": tag, "disk_gbps": f"measured ({disk['_source']})",
                 "load_efficiency": f"measured ({disk['_source']})",
                 "node_ready_s": "none: the local node is up", "engine_init_s": tag, "promote_s": tag,
                 "first_token_s": tag, "wake": "none: vLLM-CPU has no sleep mode"})


def _gpu_inputs(weights_bytes: float, devices: int, gpu: GpuProfile, measured: dict[str, Any]) -> StartupInputs:
    cpu = _cpu_inputs(weights_bytes, measured)
    disk = measured["disk"]
    return StartupInputs(
        weights_bytes=weights_bytes, source_gbps=ASSUMED_SOURCE_GBPS, disk_gbps=ASSUMED_NVME_GBPS,
        load_efficiency=disk["load_efficiency"], node_ready_s=ASSUMED_NODE_READY_S,
        engine_init_s=ASSUMED_GPU_ENGINE_INIT_S, promote_s=cpu.promote_s,
        first_token_s=ASSUMED_GPU_FIRST_TOKEN_S,
        wake_gbps=gpu.host_link.bw_bytes_s * ASSUMED_WAKE_EFFICIENCY / 1e9, devices=devices,
        wake_fixed_s=ASSUMED_WAKE_FIXED_S,
        sources={"source_gbps": "assumed: 25 Gb/s", "disk_gbps": "assumed: NVMe 3 GB/s",
                 "load_efficiency": f"measured on CPU ({disk['_source']})",
                 "node_ready_s": "assumed", "engine_init_s": "assumed", "promote_s": cpu.sources["promote_s"],
                 "first_token_s": "assumed",
                 "wake": f"assumed: {gpu.name} host link {gpu.host_link.bw_bytes_s / 1e9:g} GB/s "
                         f"(datasheet) x {ASSUMED_WAKE_EFFICIENCY}, + {ASSUMED_WAKE_FIXED_S:g} s; not measured"})


def startup_inputs_for(model: ModelSpec, gpu: GpuProfile,
                       measured: dict[str, Any] | None = None) -> StartupInputs:
    """`gpu`: the profile the model runs on (its scenario's, capacity/perf/scenario.py)."""
    measured = load_measured() if measured is None else measured
    if measured is None:
        raise ValueError(f"no start-up measurements ({MEASURED_FILE}): run ops/bench/cold_start.py")
    if model.engine is EngineKind.VLLM_CPU:
        return _cpu_inputs(_cpu_weight_bytes(model, measured), measured)
    weights = shape_for(model).weight_bytes(model.engine_settings.quantization)
    return _gpu_inputs(weights, model.parallelism.tp * model.parallelism.pp, gpu, measured)


def _cpu_weight_bytes(model: ModelSpec, measured: dict[str, Any]) -> float:
    # A local folder's own size when it is there; else the measured model's (a driver may run
    # where the weights are not, and the estimate must not fail for it).
    folder = Path(model.source).expanduser()
    if folder.is_dir():
        return float(sum(p.stat().st_size for p in folder.rglob("*.safetensors")))
    return float(measured["model_bytes"])


def startup_estimate(model: ModelSpec, gpu: GpuProfile,
                     measured: dict[str, Any] | None = None) -> dict[Tier, float] | None:
    """The policy's start-up per tier for `model` when its config states none; None when
    nothing was measured (the schema's defaults then stand)."""
    measured = load_measured() if measured is None else measured
    if measured is None:
        return None
    inputs = startup_inputs_for(model, gpu, measured)
    return startup_s(inputs, sleeping=model.standbys_sleep)
