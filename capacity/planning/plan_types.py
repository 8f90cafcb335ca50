"""The planner's values: what it searches (SearchSpace), each plan it reports (PlanCandidate),
and the ranked answer (PlanResult). capacity/planning/planner.py fills them.

A plan's `status` is what a buyer may rely on:
  - "confirmed": simulated on the trace and met the SLO; the only status ranked as feasible;
  - "candidate": the analytic model expects it to meet the SLO, but it was not simulated;
  - "missed": simulated, and it missed the SLO at every replica count tried;
  - "infeasible": ruled out before simulation (memory, the TPOT batch cap, light-load SLO).
"""

from __future__ import annotations

from dataclasses import dataclass

from hbmserve.capacity.perf.model_shape import NO_KNOWN_LOSS
from hbmserve.capacity.perf.token_cost import TokenCosts
from hbmserve.core.autoscaling_spec import AutoscalingSpec

CONFIRMED, CANDIDATE, MISSED, INFEASIBLE = "confirmed", "candidate", "missed", "infeasible"
# Formats without a known quality loss (None: unquantised); int8/int4 only when asked for.
DEFAULT_QUANTS: tuple[str | None, ...] = tuple(None if f == "bf16" else f for f in NO_KNOWN_LOSS)


@dataclass(frozen=True)
class SearchSpace:
    tps: tuple[int, ...] = (1, 2, 4, 8)
    pps: tuple[int, ...] = (1, 2)
    quantizations: tuple[str | None, ...] = DEFAULT_QUANTS
    # Grids; per layout each is cut at what the TPOT SLO allows and that limit is added
    # (capacity/perf/slo_cap.py knob_grid).
    max_num_seqs: tuple[int, ...] = (64, 128, 256)
    max_num_batched_tokens: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)
    chunked_prefill: tuple[bool, ...] = (True, False)
    max_total_gpus: int = 512
    gpu_memory_utilization: float = 0.9


@dataclass(frozen=True)
class PlanCandidate:
    gpu: str
    tp: int
    pp: int
    replicas: int
    warm_replicas: int
    quantization: str  # "bf16" when unquantised
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    usd_per_hour: float
    status: str
    reason: str
    costs: TokenCosts | None = None
    source: str = "analytic"  # or "simulated"
    # Requests/s one replica sustains within the SLO, handed to the policy: the simulator's
    # figure once confirmed, the analytic one (under its utilisation cap) before.
    capacity_rps_per_replica: float = 0.0
    analytic_capacity_rps: float | None = None  # the analytic model, SLO-bound (no utilisation cap)
    simulated_capacity_rps: float | None = None
    analytic_usd_per_hour: float | None = None  # the analytic plan's price before simulation
    max_model_len: int = 0
    quality_note: str | None = None  # the accuracy trade-off of a lossy weight format

    @property
    def feasible(self) -> bool:
        return self.status == CONFIRMED

    @property
    def analytic_error(self) -> float | None:
        """Analytic capacity over simulated, minus 1: +0.30 means the model promised 30% more."""
        if not self.simulated_capacity_rps or self.analytic_capacity_rps is None:
            return None
        return self.analytic_capacity_rps / self.simulated_capacity_rps - 1.0

    @property
    def usd_per_mtok_blended(self) -> float | None:
        return self.costs.usd_per_mtok_blended if self.costs else None

    @property
    def layout(self) -> str:
        return f"{self.gpu} TP{self.tp}" + (f" PP{self.pp}" if self.pp > 1 else "") + f" {self.quantization}"

    def to_json_dict(self) -> dict[str, object]:
        keys = ("gpu", "tp", "pp", "replicas", "warm_replicas", "quantization", "quality_note", "max_num_seqs",
                "max_num_batched_tokens", "chunked_prefill", "ttft_p95_s", "tpot_p95_s", "usd_per_hour",
                "feasible", "status", "reason", "source", "capacity_rps_per_replica", "analytic_capacity_rps",
                "simulated_capacity_rps", "analytic_error", "analytic_usd_per_hour", "max_model_len")
        costs = self.costs.to_json_dict() if self.costs else dict.fromkeys(COST_KEYS)
        return {**{k: getattr(self, k) for k in keys}, **costs,
                "autoscaling": self.autoscaling().model_dump(include=AUTOSCALING_KEYS)}

    def autoscaling(self) -> AutoscalingSpec:
        """The config file's `autoscaling` section this plan implies: the active replicas as
        the floor, the warm ones as headroom, and the capacity the plan was sized with, so the
        policy (autoscale/policy_config.py) scales with the planner's figure, not a typed guess."""
        return AutoscalingSpec(min_replicas=max(1, self.replicas),
                               max_replicas=max(1, self.replicas + self.warm_replicas),
                               **({"replica_capacity_rps": self.capacity_rps_per_replica}
                                  if self.capacity_rps_per_replica > 0 else {}))

    def engine_settings(self) -> dict[str, object]:
        """The config file's `engine_settings` keys this plan sets."""
        return {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
                "enable_chunked_prefill": self.chunked_prefill, "max_model_len": self.max_model_len,
                **({} if self.quantization == "bf16" else {"quantization": self.quantization})}


AUTOSCALING_KEYS = {"min_replicas", "max_replicas", "replica_capacity_rps"}
COST_KEYS = ("usd_per_mtok_input", "usd_per_mtok_output", "usd_per_mtok_blended", "usd_per_1k_requests",
             "input_cost_share")


@dataclass(frozen=True)
class PlanResult:
    plans: tuple[PlanCandidate, ...]  # ranked: confirmed cheapest first, then candidates, missed, infeasible
    configs_evaluated: int
    simulated: int
    why: str

    @property
    def feasible(self) -> bool:
        return bool(self.plans) and self.plans[0].feasible
