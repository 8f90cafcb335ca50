"""`hbmserve bench --predict CONFIG`: the requests the benchmark sent, through the simulator.

The config's model becomes the simulated cluster `hbmserve simulate` would run
(capacity/perf/scenario.py `scenario_for`, capacity/sim/cluster_sim.py `cluster_for`): its GPU, model shape,
TP/PP, engine settings and `replicas`, held fixed (no scaling policy; the live cluster should
not scale during the run). The arrivals are the requests as sent (loadgen.arrivals_of): their
send times and prompt and output lengths, failed requests included, as the endpoint saw them.

A simulated engine (`engine: sim`) runs `sim.speedup` times faster than the GPU it models, so a
cluster of them is predicted on its own clock: arrival times times the speedup go in, latencies
divided by it come out (bench_figures.figures_of_summary).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.perf.hardware import GpuProfile, load_catalog
from hbmserve.capacity.perf.scenario import scenario_for
from hbmserve.core.config import ClusterSpec, ConfigError, ModelSpec
from hbmserve.core.engine_settings import EngineKind
from hbmserve.ops.bench_figures import BenchFigures, figures_of_summary
from hbmserve.core.config import SloSeconds
from hbmserve.capacity.sim.cluster_sim import cluster_for, simulate
from hbmserve.capacity.sim.metrics import SimResult


@dataclass(frozen=True)
class Prediction:
    figures: BenchFigures
    result: SimResult
    clock: float  # simulated seconds per wall second
    model: str
    layout: str  # e.g. "llama-3.1-8b on h100-sxm TP1, 2 replica(s)"


def model_for(spec: ClusterSpec, served: str, source: str) -> ModelSpec:
    """The config's model of that name; else its only model (the served name may differ)."""
    m = spec.model(served)
    if m is not None:
        return m
    if len(spec.models) == 1:
        return spec.models[0]
    raise ConfigError(f"--model {served!r} is not in {source} ({', '.join(x.name for x in spec.models)}); "
                      "name the served model as the config does")


def clock_of(m: ModelSpec) -> float:
    return m.sim.speedup if m.engine is EngineKind.SIM else 1.0


def predict(m: ModelSpec, arrivals: Arrivals, slo: SloSeconds, catalog: dict[str, GpuProfile] | None = None) -> Prediction:
    """Simulate `arrivals` (wall seconds since the run's start) on the cluster `m` describes;
    judged against `slo` (wall seconds), the SLO the measurement used."""
    sc = scenario_for(m, catalog if catalog is not None else load_catalog())
    clock = clock_of(m)
    cluster = replace(cluster_for(sc), slo=SloSeconds(slo.ttft_s * clock, slo.tpot_s * clock))
    result = simulate(cluster, arrivals.scaled(clock))
    d = sc.deployment
    layout = (f"{d.model.name} on {d.gpu.name} TP{d.tp}" + (f" PP{d.pp}" if d.pp > 1 else "")
              + f", {sc.replicas} replica(s)" + (f", {clock:g}x simulated engine" if clock != 1.0 else ""))
    return Prediction(figures_of_summary(result.summary, clock), result, clock, m.name, layout)
