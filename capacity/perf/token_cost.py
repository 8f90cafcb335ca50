"""What a plan costs per token and per request, input and output apart.

A fleet's dollars per hour are split between input and output tokens by the replica time each
kind uses, as the perf model costs them at the plan's settings (activity-based costing):
  - an input token costs its share of the prefill steps of a mean prompt, chunked at the plan's
    token budget (compute-bound: about 70 us per token for a 70B model on H100 TP=4);
  - an output token costs its share of a decode step at the batch the replica runs at that
    load (step time / batch: memory-bound, the weights are read once per step for the whole
    batch).
Idle and warm-replica time is spread pro rata, so input dollars + output dollars = the fleet's
dollars. Quoting dollars per million output tokens alone charged a prompt-heavy workload (code
completion: 2,000 prompt tokens, 40 output tokens) its whole prefill bill on 2% of its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from hbmserve.capacity.perf.perf_model import StepCostModel
from hbmserve.capacity.perf.plan_analytic import Workload


@dataclass(frozen=True)
class TokenCosts:
    usd_per_mtok_input: float
    usd_per_mtok_output: float
    usd_per_mtok_blended: float  # all tokens, at the workload's input/output mix
    usd_per_1k_requests: float
    input_share: float  # fraction of replica time (and dollars) spent on input tokens

    def to_json_dict(self) -> dict[str, float]:
        return {"usd_per_mtok_input": self.usd_per_mtok_input, "usd_per_mtok_output": self.usd_per_mtok_output,
                "usd_per_mtok_blended": self.usd_per_mtok_blended, "usd_per_1k_requests": self.usd_per_1k_requests,
                "input_cost_share": self.input_share}


def token_costs(cost: StepCostModel, budget: int, decode_batch: float, w: Workload,
                usd_per_hour: float) -> TokenCosts | None:
    """None when the workload has no traffic to charge."""
    if w.rate_rps <= 0 or usd_per_hour <= 0:
        return None
    prompt, out = max(1.0, w.prompt_mean), max(1.0, w.output_mean)
    in_s = cost.prefill_time(round(prompt), max(1, budget)) / round(prompt)
    b = max(1.0, decode_batch)
    out_s = float(cost.step_time(b, b * (prompt + out / 2))) / b
    share = prompt * in_s / (prompt * in_s + out * out_s)
    per_hour = w.rate_rps * 3600.0
    return TokenCosts(
        usd_per_mtok_input=usd_per_hour * share / (per_hour * prompt / 1e6),
        usd_per_mtok_output=usd_per_hour * (1.0 - share) / (per_hour * out / 1e6),
        usd_per_mtok_blended=usd_per_hour / (per_hour * (prompt + out) / 1e6),
        usd_per_1k_requests=usd_per_hour / (per_hour / 1e3),
        input_share=share)
