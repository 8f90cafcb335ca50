"""Evaluating a scaling policy: replay a trace through the capacity simulator with the policy in
the loop - the very `decide` the live adapter calls, taken from the registry - and report SLO
attainment, GPU-hours, dollars, scale actions and dropped requests.

Every policy sees the same cluster, told to it through the one AutoscaleConfig the live system
would build for the model (autoscale/policy_config.py `autoscale_config_for`), from which each
baseline derives its own (autoscale/registry.py):
  - bounds, queue target, pools, delays and start-up times from the cluster file's
    `autoscaling`, TTFT and TPOT targets from `slo`;
  - per-replica capacity (requests/s at the SLO): the file's `replica_capacity_rps` when it
    states one, else the capacity model's for this trace's request lengths
    (`capacity.plan_analytic.capacity_rps`);
  - the trace's peak rate (busiest aligned minute), which only static-peak uses.

Start: a live system was running before the trace began, so every policy starts with the
replicas its own first decision asks for, and at least enough for the trace's first minute at
the target utilisation (so an autoscaler is not charged a cold start at t=0, and static-peak
starts at its fixed count).

Counted: `scale_actions` is the number of times the policy changed its active-replica target
(`target_changes`) plus every replica it started - to serve or as a standby - and removed
before it served a request (`cancelled_starts`): each of those billed a whole replica from its
order and is churn an operator sees, though a pool's flapping changes no active target. An
up-then-down blip that cancels a start therefore counts three: the order, the cancel and the
wasted start. `dropped_requests` is every request that never finished (rejected at admission,
e.g. longer than max_model_len, or still unfinished when the simulation ends).

The oracle (the registry's `clairvoyant` entry) is planned from the whole trace by
capacity/sim/oracle_search.py and replayed like any policy; the reports give every policy's GPU-hours over its.
Beside the policies, the static frontier (capacity/sim/frontier.py: a fixed fleet of each size) marks
which of them some fixed fleet dominates; capacity/sim/comparison.py runs them all and checks that no
run undercuts the oracle.

`evaluate` is pure apart from CPU time; `load_eval_cluster` is the one function that reads files.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from hbmserve.autoscale.policy_config import autoscale_config_for
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.registry import POLICIES, PolicyEntry
from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.perf.scenario import Scenario, tpot_floor_s
from hbmserve.capacity.perf.startup_measured import startup_estimate
from hbmserve.core.autoscaling_spec import TierStartup
from hbmserve.core.config import ModelSpec
from hbmserve.core.scaling import Snapshot, Tier
from hbmserve.capacity.sim.metrics import SimSummary

REFERENCE_CLUSTER_FILE = "reference_cluster.yaml"
# Ray Serve's controller runs its autoscaling step every control-loop iteration (0.1 s); a 1 s
# period keeps every policy's delays exact to a second at a small cost.
DEFAULT_DECISION_INTERVAL_S = 1.0


class EvalError(ValueError):
    """Input the evaluation cannot use; the message names the field."""


@dataclass(frozen=True)
class TraceScaling:
    """How a trace is reshaped before the run: time first (0.5 = twice the rate), then tokens
    (prompt and output lengths times token_scale, at least 1), then the first clip_s seconds."""

    time_scale: float = 1.0
    token_scale: float = 1.0
    clip_s: float | None = None

    def __post_init__(self) -> None:
        for name, flag in (("time_scale", "--time-scale"), ("token_scale", "--token-scale")):
            if not getattr(self, name) > 0:
                raise EvalError(f"{flag} must be > 0, got {getattr(self, name)}")
        if self.clip_s is not None and not self.clip_s > 0:
            raise EvalError(f"--clip must be > 0 seconds, got {self.clip_s}")


def scale_trace(arr: Arrivals, scaling: TraceScaling) -> Arrivals:
    if scaling.time_scale != 1.0:
        arr = arr.scaled(scaling.time_scale)
    if scaling.token_scale != 1.0:
        def grow(x: np.ndarray) -> np.ndarray:
            return np.maximum(1, np.rint(x * scaling.token_scale)).astype(np.int64)

        arr = Arrivals(arr.t, grow(arr.prompt), grow(arr.output), arr.hashes)
    if scaling.clip_s is not None:
        arr = arr.window(0.0, scaling.clip_s)
        if not len(arr):
            raise EvalError(f"--clip {scaling.clip_s:g}: no request arrives in the first "
                            f"{scaling.clip_s:g} s of the trace")
    return arr


@dataclass(frozen=True)
class EvalCluster:
    model: ModelSpec  # with an `autoscaling` section
    scenario: Scenario
    decision_interval_s: float = DEFAULT_DECISION_INTERVAL_S
    source: str = f"(embedded {REFERENCE_CLUSTER_FILE})"

    @property
    def model_name(self) -> str:
        return self.model.name


def load_eval_cluster(path: str | os.PathLike[str] | None = None, *, model: str | None = None,
                      startup_s: Mapping[Tier, float] | None = None,
                      decision_interval_s: float = DEFAULT_DECISION_INTERVAL_S,
                      catalog: str | os.PathLike[str] | None = None) -> EvalCluster:
    """The cluster file's model (first one unless `model` names another); None: the reference.
    `startup_s` replaces the tiers it names in the model's `autoscaling.startup_s`.

    Raises the cluster/capacity modules' own errors (ConfigError, ScenarioError, ...) or
    EvalError, each a one-line message for the user."""
    from hbmserve.capacity.perf.hardware import load_catalog
    from hbmserve.capacity.perf.scenario import scenario_for
    from hbmserve.core.config import load_cluster_spec

    if not decision_interval_s > 0:
        raise EvalError(f"--decision-interval must be > 0, got {decision_interval_s}")
    if path is None:
        ref = resources.files("hbmserve.capacity.sim").joinpath("data", REFERENCE_CLUSTER_FILE)
        with resources.as_file(ref) as p:
            spec = load_cluster_spec(p)
        source = f"(embedded {REFERENCE_CLUSTER_FILE})"
    else:
        spec, source = load_cluster_spec(path), str(path)
    m = spec.model(model) if model else spec.models[0]
    if m is None:
        raise EvalError(f"--model {model!r} is not in {source} "
                        f"({', '.join(x.name for x in spec.models)})")
    if m.autoscaling is None:
        raise EvalError(f"models.{m.name}.autoscaling: missing; the evaluation needs "
                        "min_replicas and max_replicas")
    return EvalCluster(with_startup(m, startup_s), scenario_for(m, load_catalog(catalog)),
                       decision_interval_s, source)


def with_startup(model: ModelSpec, startup_s: Mapping[Tier, float] | None) -> ModelSpec:
    """`model` with the start-up tiers in `startup_s` replaced (command-line overrides)."""
    if not startup_s or model.autoscaling is None:
        return model
    now = model.autoscaling.startup_s
    values = {t.value: float(startup_s.get(t, getattr(now, t.value))) for t in Tier}
    try:
        startup = TierStartup(**values)
    except ValueError:
        raise EvalError("start-up times need 0 <= hot ({hot:g}) <= warm ({warm:g}) <= cold "
                        "({cold:g})".format(**values)) from None
    auto = model.autoscaling.model_copy(update={"startup_s": startup})
    return model.model_copy(update={"autoscaling": auto})


def estimate_capacity_rps(sc: Scenario, arr: Arrivals, model_name: str) -> float:
    """Requests/s one replica of `sc` sustains at its SLO for the request lengths of `arr`."""
    from hbmserve.capacity.perf.perf_model import cost_model
    from hbmserve.capacity.perf.plan_analytic import EngineKnobs, capacity_rps
    from hbmserve.capacity.sim.workload import workload_of

    e = sc.engine
    knobs = EngineKnobs(e.max_num_seqs, e.max_num_batched_tokens, e.enable_chunked_prefill,
                        e.num_blocks * e.block_size)
    cap, light = capacity_rps(cost_model(sc.deployment), knobs, workload_of(arr), sc.slo_ttft_s,
                              sc.slo_tpot_s)
    if cap <= 0:
        raise EvalError(f"models.{model_name}: one replica misses the SLO even at light load (p95 TTFT "
                        f"{light.ttft_p95_s:.2f} s, TPOT {light.tpot_p95_s:.3f} s)")
    return cap


def eval_config(cluster: EvalCluster, arr: Arrivals | None) -> AutoscaleConfig:
    """What every policy is told: see the module docstring. `arr` None (a history of rates, no
    request lengths): the replica capacity the config states."""
    cap = estimate_capacity_rps(cluster.scenario, arr, cluster.model_name) if arr is not None else None
    config = autoscale_config_for(cluster.model, cap, tpot_floor_s(cluster.scenario),
                                  startup_estimate(cluster.model, cluster.scenario.deployment.gpu))
    if config is None:
        raise EvalError(f"models.{cluster.model_name}.autoscaling: missing")
    return config


def initial_replicas(decide: Any, policy_config: Any, state: Any, config: AutoscaleConfig,
                     arr: Arrivals) -> int:
    """Module docstring, "Start"."""
    first, _ = decide(Snapshot(now=0.0, replicas=()), policy_config, state)
    first_minute = arr.window(0.0, 60.0)
    rate = len(first_minute) / 60.0
    warm = math.ceil(rate / (config.replica_capacity_rps * config.target_utilization))
    return max(config.min_replicas, min(config.max_replicas, max(first.target_active, warm)))


def count_scale_actions(decisions: tuple[tuple[float, int, str], ...], initial: int) -> int:
    actions, current = 0, initial
    for _, target, _ in decisions:
        if target != current:
            actions, current = actions + 1, target
    return actions


@dataclass(frozen=True)
class EvalResult:
    policy: str
    summary: SimSummary
    config: AutoscaleConfig  # hbmserve's, from which the policy's own was derived
    peak_rps: float
    initial_replicas: int
    target_changes: int  # of the active-replica target
    replicas_started: int  # replicas brought up after the start, standbys included
    timeseries: dict[str, np.ndarray] = field(default_factory=dict)
    decisions: tuple[tuple[float, int, str], ...] = ()
    met_slo: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # per request
    cancelled_starts: int = 0  # replicas started and removed before they served
    detail: dict[str, Any] = field(default_factory=dict)  # policy-specific, added to the JSON

    @property
    def scale_actions(self) -> int:
        return self.target_changes + self.cancelled_starts

    @property
    def dropped_requests(self) -> int:
        return self.summary.requests - self.summary.finished

    @property
    def scale_actions_per_hour(self) -> float:
        return self.scale_actions / max(self.summary.makespan_s / 3600.0, 1e-9)

    def to_json_dict(self) -> dict[str, Any]:
        s = self.summary
        return {
            "policy": self.policy,
            "slo_attainment": s.slo_attainment, "ttft_p50_s": s.ttft.p50, "ttft_p95_s": s.ttft.p95,
            "ttft_p99_s": s.ttft.p99, "tpot_p50_s": s.tpot.p50, "tpot_p95_s": s.tpot.p95,
            "gpu_hours": s.gpu_hours, "cost_usd": s.cost_usd, "usd_per_mtok": s.usd_per_mtok,
            "scale_actions": self.scale_actions, "scale_actions_per_hour": self.scale_actions_per_hour,
            "target_changes": self.target_changes, "cancelled_starts": self.cancelled_starts,
            "replicas_started": self.replicas_started, "dropped_requests": self.dropped_requests,
            "requests": s.requests, "finished": s.finished, "rejected": s.rejected,
            "unfinished": s.unfinished, "preemptions": s.preemptions,
            "mean_replicas": s.mean_replicas, "peak_replicas": s.peak_replicas,
            "initial_replicas": self.initial_replicas, "makespan_s": s.makespan_s,
            "replica_capacity_rps": self.config.replica_capacity_rps, "peak_rps": self.peak_rps,
            **self.detail,
        }


def _look_back_s(config: Any) -> float:
    """The window the policy expects its snapshot's TTFT samples and arrival rate over."""
    for name in ("look_back_s", "look_back_period_s"):
        value = getattr(config, name, None)
        if value is not None:
            return float(value)
    return 30.0


def evaluate(policy: str, cluster: EvalCluster, arr: Arrivals,
             config: AutoscaleConfig | None = None, entry: PolicyEntry | None = None,
             fleets: Any = None) -> EvalResult:
    """Run the registered policy `policy` over `arr` on `cluster` (config: eval_config(cluster,
    arr)). `entry` replaces the registry's, e.g. a baseline with another config mapping; the
    result is still labelled `policy`. A clairvoyant entry (the oracle) is planned from the
    whole trace first (capacity/sim/oracle_search.py), drawing on `fleets` (capacity/sim/frontier.py FleetRuns,
    shared with the static frontier) for its fixed-fleet candidates."""
    entry = entry or POLICIES.get(policy)
    if entry is None:
        raise EvalError(f"--policy {policy!r}: not one of {', '.join(POLICIES)}")
    config = config or eval_config(cluster, arr)
    if entry.clairvoyant:
        from hbmserve.capacity.sim.oracle_search import plan_oracle

        return plan_oracle(cluster, arr, config, label=policy, entry=entry, fleets=fleets).result
    return run_policy(policy, entry, entry.make_config(config, arr.rate_peak()), cluster, arr,
                      config)


def run_policy(label: str, entry: PolicyEntry, policy_config: Any, cluster: EvalCluster,
               arr: Arrivals, config: AutoscaleConfig) -> EvalResult:
    """One simulator run of `entry.decide` bound to `policy_config`."""
    from hbmserve.capacity.sim.cluster_sim import PolicyBinding, cluster_for, simulate

    start = initial_replicas(entry.decide, policy_config, entry.initial_state(), config, arr)
    binding = PolicyBinding(lambda snapshot, state: entry.decide(snapshot, policy_config, state),
                            entry.initial_state(), cluster.decision_interval_s,
                            lookback_s=_look_back_s(policy_config), startup_s=config.startup_s)
    sc = cluster.scenario
    sim = cluster_for(sc, start)
    result = simulate(sim, arr, binding)
    return EvalResult(label, result.summary, config, arr.rate_peak(), start,
                      count_scale_actions(result.decisions, start),
                      len(result.replicas) - start, result.timeseries, result.decisions,
                      result.met_slo, result.cancelled_starts)
