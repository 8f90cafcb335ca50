"""Sizing a model's LoRA slots (issue 25): how many adapters each replica runs on the GPU and keeps
in host memory, how many replicas that takes, and what each adapter costs per token.

Two settings decide what serving many adapters costs (core/adapters.py `LoraSlots`, the engine's
model of them in capacity/perf/lora.py). `max_loras`, the adapters one step may run: with too
few, requests for other adapters wait for a slot to go idle, the batch starves and TTFT grows
until more replicas (more slots in all) make up for it. `max_cpu_loras`, the adapters a replica
keeps in host memory: with too few, replicas keep reading adapters from storage, each load
stalling a step. How many are enough depends on the skew: a few hot adapters fit in few slots,
many cold ones need more for the same loads.

For each candidate (GPU slots, host slots) the simulator finds the fewest replicas that meet the
SLO on the trace (confirm.py `smallest_fleet`, the planner's own search, with `choose`, the
adapter-aware router that ships). The most generous candidate is searched first; one with fewer
slots starts from the most its more generous neighbours needed, and is not searched above a count
where one of them missed (fewer slots only add waits and loads). The cheapest per million tokens
wins; among candidates within 2% of it, the fewest GPU slots (each holds HBM), then the fewest
host slots that load within 20% of the fewest loads (a slot of host memory is cheap, a load
stalls a step).

The pick's dollars are then split per adapter by activity (as capacity/perf/token_cost.py splits
input and output): each adapter pays the replica time its own loads stalled, and the rest of the
fleet's dollars by its tokens, input and output apart. So the adapters' dollars sum to the
fleet's, and a cold adapter pays more per token: its loads are spread over few tokens.
Pure apart from CPU time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.perf.lora import STEP_FACTOR, adapter_bytes, lora_cost
from hbmserve.capacity.perf.perf_model import cost_model
from hbmserve.capacity.perf.plan_analytic import estimate
from hbmserve.capacity.perf.scenario import Scenario, knobs_of
from hbmserve.capacity.perf.token_cost import token_costs
from hbmserve.capacity.planning.confirm import FleetRun, smallest_fleet
from hbmserve.capacity.sim.evaluate import estimate_capacity_rps
from hbmserve.capacity.sim.metrics import SimSummary
from hbmserve.capacity.sim.workload import workload_of
from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.core.config import SloSeconds

DEFAULT_GPU_SLOTS = (1, 2, 4, 8, 16, 32)
HOST_MULTIPLES = (1, 2, 4, 8)  # host slots tried: these multiples of the GPU slots, and every adapter
TIE = 1.02  # within 2% of the cheapest: the fewest slots win
LOADS_SLACK = 1.2  # host slots: the fewest that load within 20% of the fewest loads any setting gets
BASE = "(base model)"
GIB = 1 << 30


@dataclass(frozen=True)
class SlotOption:
    max_loras: int  # GPU slots per replica
    max_cpu_loras: int  # host slots per replica
    replicas: int  # the fewest that meet the SLO (the largest tried when none does)
    meets_slo: bool
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    slo_attainment: float
    loads_per_min: float  # adapters read from storage, all replicas together
    usd: float  # the fleet over the trace
    usd_per_mtok: float | None  # per million tokens, input and output together


@dataclass(frozen=True)
class AdapterCost:
    adapter: str  # BASE: requests naming no adapter; "N others": a tail summed
    requests: int
    input_tokens: int
    output_tokens: int
    loads: int
    load_usd: float  # the replica time its loads stalled
    usd_input: float  # its input tokens' share, plus load_usd
    usd_output: float

    @property
    def usd_per_mtok_input(self) -> float | None:
        return self.usd_input / self.input_tokens * 1e6 if self.input_tokens else None

    @property
    def usd_per_mtok_output(self) -> float | None:
        return self.usd_output / self.output_tokens * 1e6 if self.output_tokens else None

    @property
    def usd_per_mtok(self) -> float | None:
        tokens = self.input_tokens + self.output_tokens
        return (self.usd_input + self.usd_output) / tokens * 1e6 if tokens else None


@dataclass(frozen=True)
class SlotPlan:
    options: tuple[SlotOption, ...]  # most slots first
    best: SlotOption
    reason: str
    adapters: tuple[AdapterCost, ...]  # the pick's, most requests first; their dollars sum to `best.usd`


def slot_candidates(adapters: int, gpu_slots: Sequence[int] = DEFAULT_GPU_SLOTS) -> list[tuple[int, int]]:
    """(GPU slots, host slots) to try for `adapters` adapters, most slots first."""
    gpus = {g for g in gpu_slots if g <= adapters} | ({adapters} if adapters < max(gpu_slots) else set())
    return sorted(((g, h) for g in gpus for h in {g * m for m in HOST_MULTIPLES if g * m < adapters} | {adapters}),
                  reverse=True)


def plan_adapter_slots(sc: Scenario, arrivals: Arrivals, rank: int, gpu_slots: Sequence[int] = DEFAULT_GPU_SLOTS,
                       first_guess: int | None = None) -> SlotPlan:
    """Each slot candidate's fewest replicas on `arrivals` (which name adapters) for `sc`'s model,
    SLO and price, at adapter rank `rank`; the pick, why, and its dollars per adapter."""
    n = len(arrivals.adapter_names)
    if arrivals.adapters is None or n == 0 or not (arrivals.adapters >= 0).any():
        raise ValueError("the trace names no adapter: nothing to plan slots for")
    if not gpu_slots or min(gpu_slots) < 1:
        raise ValueError("GPU slots must be >= 1")
    slo = SloSeconds(sc.slo_ttft_s, sc.slo_tpot_s)
    guess = first_guess or _first_guess(sc, arrivals)
    runs: dict[tuple[int, int], FleetRun] = {}
    for g, h in slot_candidates(n, gpu_slots):
        eng = dataclasses.replace(sc.engine, lora=lora_cost(sc.deployment, g, h, rank))
        wider = [r for (g2, h2), r in runs.items() if g2 >= g and h2 >= h]
        start = max((r.replicas for r in wider), default=guess)
        most = max((r.replicas for r in wider if not r.ok), default=None)  # no fewer slots meet above it
        runs[g, h] = smallest_fleet(sc.deployment, eng, slo, arrivals, start, most=most)
    tokens = int(arrivals.prompt.sum() + arrivals.output.sum())
    options = tuple(_option(g, h, r, tokens) for (g, h), r in runs.items())
    best, reason = _pick(options, adapter_bytes(sc.deployment.model, rank) / GIB, n)
    return SlotPlan(options, best, reason, adapter_costs(sc, arrivals, runs[best.max_loras, best.max_cpu_loras]))


def _first_guess(sc: Scenario, arrivals: Arrivals) -> int:
    """Replicas for the busiest minute at the analytic model's capacity, slowed by LoRA's step factor."""
    try:
        cap = estimate_capacity_rps(sc, arrivals, "plan")
    except ValueError:
        return max(1, sc.replicas)
    return max(1, math.ceil(workload_of(arrivals).peak_rps * STEP_FACTOR / cap))


def _option(g: int, h: int, run: FleetRun, tokens: int) -> SlotOption:
    s = run.summary
    return SlotOption(g, h, run.replicas, run.ok, s.ttft.p95, s.tpot.p95, s.slo_attainment,
                      s.adapter_loads / max(s.makespan_s, 1e-9) * 60, s.cost_usd,
                      s.cost_usd / tokens * 1e6 if tokens else None)


def _usd_per_mtok(o: SlotOption) -> float:
    return math.inf if o.usd_per_mtok is None else o.usd_per_mtok


def _closest(options: Sequence[SlotOption]) -> SlotOption:
    """Among those meeting the SLO, within TIE of the cheapest: the fewest GPU slots, then the fewest
    host slots that load within LOADS_SLACK of the fewest loads. None meeting: the lowest TTFT."""
    meeting = [o for o in options if o.meets_slo]
    if not meeting:
        return min(options, key=lambda o: (math.inf if o.ttft_p95_s is None else o.ttft_p95_s))
    cheapest = min(_usd_per_mtok(o) for o in meeting)
    ties = [o for o in meeting if _usd_per_mtok(o) <= cheapest * TIE]
    gpu = min(o.max_loras for o in ties)
    ties = [o for o in ties if o.max_loras == gpu]
    floor = min(o.loads_per_min for o in ties)
    return min((o for o in ties if o.loads_per_min <= floor * LOADS_SLACK + 1e-9), key=lambda o: o.max_cpu_loras)


def _verdict(o: SlotOption) -> str:
    fleet = f"{o.replicas} replica{'s' if o.replicas != 1 else ''}"
    if o.meets_slo:
        return f"{fleet} at ${_usd_per_mtok(o):.3f}/Mtok"
    return f"TTFT p95 {'-' if o.ttft_p95_s is None else f'{o.ttft_p95_s:.3g} s'} on {fleet}"


def _pick(options: Sequence[SlotOption], host_gib_per_slot: float, adapters: int) -> tuple[SlotOption, str]:
    best = _closest(options)
    if not best.meets_slo:
        return best, "no slot setting meets the SLO within the replica counts tried: the closest is shown"
    parts = [f"{best.max_loras} GPU slots and {best.max_cpu_loras} host slots "
             f"({best.max_cpu_loras * host_gib_per_slot:.2f} GiB of host memory) a replica: {_verdict(best)}, "
             f"{best.loads_per_min:.0f} adapter loads/min"]
    gpus = sorted({o.max_loras for o in options})
    fewer = [g for g in gpus if g < best.max_loras]
    if fewer:
        o = _closest([o for o in options if o.max_loras == fewer[-1]])
        parts.append(f"{o.max_loras} GPU slots " + (f"need {_verdict(o)}" if o.meets_slo else
                                                    f"starve the batch ({_verdict(o)})"))
    more = [g for g in gpus if g > best.max_loras]
    if not more and best.max_loras < adapters:
        parts.append(f"more than {best.max_loras} GPU slots were not tried")
    if more:
        o = _closest([o for o in options if o.max_loras == more[0]])
        good = o.meets_slo and _usd_per_mtok(o) <= _usd_per_mtok(best) * TIE
        parts.append(f"{o.max_loras} buy nothing" if good else f"{o.max_loras} GPU slots: {_verdict(o)}")
    hosts = [o for o in options if o.max_loras == best.max_loras and o.max_cpu_loras < best.max_cpu_loras]
    if hosts:
        o = max(hosts, key=lambda o: o.max_cpu_loras)
        same = o.meets_slo and o.replicas == best.replicas
        parts.append(f"{o.max_cpu_loras} host slots reload {o.loads_per_min:.0f} adapters/min"
                     + ("" if same else f" ({_verdict(o)})"))
    return best, "; ".join(parts)


def adapter_costs(sc: Scenario, arrivals: Arrivals, run: FleetRun) -> tuple[AdapterCost, ...]:
    """The run's dollars per adapter (and the base model), most requests first: each pays its loads'
    replica time, and the rest by its input and output tokens (module docstring)."""
    s: SimSummary = run.summary
    names = (*arrivals.adapter_names, BASE)
    which = np.full(len(arrivals), len(names) - 1) if arrivals.adapters is None else \
        np.where(arrivals.adapters < 0, len(names) - 1, arrivals.adapters)
    reqs = np.bincount(which, minlength=len(names))
    tok_in = np.bincount(which, weights=arrivals.prompt, minlength=len(names))
    tok_out = np.bincount(which, weights=arrivals.output, minlength=len(names))
    by = {a.adapter: a for a in s.adapter_loads_by}
    per_s = sc.usd_per_gpu_hour * sc.deployment.num_gpus / 3600
    load_usd = np.array([by[a].load_s * per_s if a in by else 0.0 for a in names])
    pool = s.cost_usd - load_usd.sum()
    share = _input_share(sc, arrivals, run.replicas)
    usd_in = pool * share * tok_in / max(tok_in.sum(), 1) + load_usd
    usd_out = pool * (1 - share) * tok_out / max(tok_out.sum(), 1)
    rows = [AdapterCost(a, int(reqs[i]), int(tok_in[i]), int(tok_out[i]), by[a].loads if a in by else 0,
                        float(load_usd[i]), float(usd_in[i]), float(usd_out[i]))
            for i, a in enumerate(names) if reqs[i]]
    return tuple(sorted(rows, key=lambda c: (-c.requests, c.adapter)))


def _input_share(sc: Scenario, arrivals: Arrivals, replicas: int) -> float:
    """The share of replica time input tokens take at this load (token_cost.py)."""
    w, cost = workload_of(arrivals), cost_model(sc.deployment)
    batch = estimate(cost, knobs_of(sc), w, w.rate_rps / max(1, replicas)).batch
    costs = token_costs(cost, sc.engine.max_num_batched_tokens, batch, w, 1.0)
    return costs.input_share if costs else 0.5


def hot_and_tail(costs: Sequence[AdapterCost], top: int = 5) -> tuple[AdapterCost, ...]:
    """The `top` busiest adapters, the rest summed as one row (their tokens and dollars), then the
    base model's requests if any."""
    adapters = [c for c in costs if c.adapter != BASE]
    head, rest = tuple(adapters[:top]), adapters[top:]
    tail = (AdapterCost(f"{len(rest)} others", *(sum(getattr(c, f) for c in rest) for f in (
        "requests", "input_tokens", "output_tokens", "loads", "load_usd", "usd_input", "usd_output"))),) if rest else ()
    return (*head, *tail, *(c for c in costs if c.adapter == BASE))
