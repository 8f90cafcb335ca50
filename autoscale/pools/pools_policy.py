"""Two pools, one policy: a disaggregated model's prefill and decode pools scaled in one decision.

    decide_pools(snapshot: PoolsSnapshot, config: PoolsConfig, state: PoolsState)
        -> (PoolsDecision, PoolsState)

Pure, like `decide` (autoscale/policy.py), and built from its stages: each pool runs
read_signals -> needs_of -> wish -> apply_hysteresis with its own config, so each keeps the
rate forecast, the queue drain, the latency needs and the hysteresis the aggregated policy has.
What one decision adds is what neither pool can see alone:

* Prefill scales on TTFT and the prompt-token backlog. Its config carries the TTFT target and no
  TPOT target (a prefill replica emits one token). The backlog is counted in tokens, not
  requests: one 30k-token prompt is 100 chat turns of work. Waiting prompt tokens that the
  pool's `prefill_tokens_per_s` cannot clear within `backlog_budget` of the TTFT target ask for
  enough replicas to carry the prompt-token arrivals plus the backlog within the drain time
  (`backlog_need`). Its capacity in requests/s is the config's, at the trace's prompt mean.
* Decode scales on TPOT and KV usage. Its config carries the TPOT target; its TTFT need is off
  (the client's first token waits mostly on prefill). KV usage over `kv_target` asks for
  active x usage / kv_target replicas (`kv_need`): a decode pool whose KV is full admits the
  next hand-off only after a sequence ends, so the TTFT grows while TPOT still looks fine.
* A TTFT miss is charged to the pool that causes it. TTFT runs through both pools; while the
  decode pool queues past its target, the misses are its queue's (requests wait there with
  their KV loaded), so the TTFT samples go to the decode pool's TTFT need instead of the
  prefill pool's. Scaling prefill then would only push more KV at a pool that cannot take it.
* Decode sees demand one prefill early. Every request enters the prefill pool first, so the
  decode pool's rate signal is the larger of its own arrivals and the prefill pool's: a step
  in traffic reaches the decode forecast when it arrives, not after the prefill queue drained.
* Decode does not shrink while prefill holds a backlog over budget: those requests are on
  their way to it.

The pools keep no standbys (hot or warm): the per-pool configs this policy is given are taken
with their pool bounds at 0 (`pool_config`), and the reason says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from hbmserve.autoscale.policy import PolicyState
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.stages import Needs, Outcome, apply_hysteresis, explain, needs_of, read_signals, wish
from hbmserve.autoscale.warm_pool import PoolSizing
from hbmserve.core.scaling import ScaleDecision, Snapshot, Tier

NO_STANDBYS = PoolSizing(0, 0, "pools keep no standbys")


@dataclass(frozen=True)
class PoolsSnapshot:
    """What both pools show at one instant. `prefill.ttft_samples_s` are the client's TTFTs
    (arrival to first streamed token, through both pools); `decode.tpot_samples_s` its TPOTs."""

    prefill: Snapshot
    decode: Snapshot
    prompt_backlog_tokens: int = 0  # prompt tokens waiting on the prefill pool, not yet computed
    prompt_tokens_rps: float = 0.0  # prompt tokens arriving per second over the look-back

    @property
    def now(self) -> float:
        return self.prefill.now


@dataclass(frozen=True)
class PoolsConfig:
    prefill: AutoscaleConfig  # its TTFT target; its replica_capacity_rps at the prompt mean
    decode: AutoscaleConfig  # its TPOT target; its replica_capacity_rps at the output mean
    prefill_tokens_per_s: float  # prompt tokens one prefill replica computes per second
    kv_target: float = 0.9  # decode KV usage over this asks for more decode replicas
    backlog_budget: float = 0.5  # share of the TTFT target a prompt backlog may take to clear

    def __post_init__(self) -> None:
        problems = [f"{name} must be > 0" for name in ("prefill_tokens_per_s", "kv_target", "backlog_budget")
                    if not getattr(self, name) > 0]
        if self.kv_target > 1:
            problems.append(f"kv_target is a share of the KV cache, at most 1, got {self.kv_target}")
        if problems:
            raise ValueError("; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as Serve carries a policy's kwargs."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PoolsConfig:
        return cls(**{**values, "prefill": AutoscaleConfig.from_dict(values["prefill"]),
                      "decode": AutoscaleConfig.from_dict(values["decode"])})


def pool_config(config: AutoscaleConfig, *, decode: bool) -> AutoscaleConfig:
    """A pool's copy of a model's AutoscaleConfig: no standby pools, and a TPOT target only for
    the decode pool. The TTFT target stays in both: it sets the queue's drain time
    (stages.needs_of), and decide_pools gives each pool only the TTFT samples it answers for."""
    return replace(config, hot_standby_min=0, hot_standby_max=0, warm_pool_min=0, warm_pool_max=0,
                   tpot_p95_target_s=config.tpot_p95_target_s if decode else None)


@dataclass(frozen=True)
class PoolsState:
    prefill: PolicyState = PolicyState()
    decode: PolicyState = PolicyState()

    def to_dict(self) -> dict[str, Any]:
        return {"prefill": self.prefill.to_dict(), "decode": self.decode.to_dict()}

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> PoolsState:
        values = values or {}
        return cls(*(PolicyState.from_dict(values[k]) if values.get(k) else PolicyState()
                     for k in ("prefill", "decode")))


@dataclass(frozen=True)
class PoolsDecision:
    prefill: ScaleDecision
    decode: ScaleDecision
    reason: str  # the one reason: both actions first, then each pool's signals; each pool's
    # ScaleDecision.reason is its own action, then this


def backlog_need(backlog_tokens: int, active: int, tokens_rps: float, replica_tokens_s: float,
                 budget_s: float, drain_s: float) -> int:
    """Prefill replicas (in all) that clear a prompt-token backlog; 0 when the active ones
    clear it within `budget_s`. Otherwise enough to carry the arrivals plus the backlog within
    `drain_s` (signals.queue_need's rule, in tokens)."""
    if backlog_tokens <= 0 or backlog_tokens <= replica_tokens_s * active * budget_s:
        return 0
    return math.ceil((tokens_rps + backlog_tokens / drain_s) / replica_tokens_s)


def kv_need(mean_kv_usage: float, active: int, kv_target: float) -> int:
    """Decode replicas (in all) that bring the mean KV usage back to `kv_target`; 0 under it."""
    if active < 1 or mean_kv_usage <= kv_target:
        return 0
    return math.ceil(active * mean_kv_usage / kv_target)


def decide_pools(snapshot: PoolsSnapshot, config: PoolsConfig,
                 state: PoolsState) -> tuple[PoolsDecision, PoolsState]:
    pre_cfg, dec_cfg = config.prefill, config.decode
    dec_view = replace(snapshot.decode, ttft_samples_s=(),
                       arrival_rate_rps=max(snapshot.decode.arrival_rate_rps, snapshot.prefill.arrival_rate_rps))
    dec_signals = read_signals(dec_view, dec_cfg, state.decode)
    dec_load = dec_signals.load
    decode_queues = dec_load.waiting > dec_cfg.target_queue_per_replica * max(dec_load.active, 1)
    notes = []
    pre_view = snapshot.prefill
    if decode_queues and snapshot.prefill.ttft_samples_s:
        # The TTFT misses are the decode queue's: charge them there (module docstring).
        notes.append("TTFT charged to decode (its queue)")
        dec_view = replace(dec_view, ttft_samples_s=snapshot.prefill.ttft_samples_s)
        dec_signals = read_signals(dec_view, dec_cfg, state.decode)
        pre_view = replace(pre_view, ttft_samples_s=())
    pre_signals = read_signals(pre_view, pre_cfg, state.prefill)

    drain_s = min(pre_cfg.backlog_drain_s, max(pre_cfg.ttft_p95_target_s, pre_cfg.startup_s[pre_signals.tier_for(1)]))
    backlog = backlog_need(snapshot.prompt_backlog_tokens, pre_signals.load.active, snapshot.prompt_tokens_rps,
                           config.prefill_tokens_per_s, config.backlog_budget * pre_cfg.ttft_p95_target_s, drain_s)
    pre_needs = _with(needs_of(pre_signals, pre_cfg), backlog)
    kv = kv_need(dec_load.mean_kv_usage, dec_load.active, config.kv_target)
    dec_needs = needs_of(dec_signals, dec_cfg)
    if not decode_queues:
        dec_needs = replace(dec_needs, ttft=0)
    dec_needs = _with(dec_needs, kv)
    dec_wish = wish(dec_needs, dec_signals, dec_cfg)
    if backlog and dec_wish.slack:
        notes.append("decode held: the prompt backlog is on its way to it")
        dec_wish = replace(dec_wish, slack=False)

    pre_out = apply_hysteresis(wish(pre_needs, pre_signals, pre_cfg), pre_signals, state.prefill, pre_cfg)
    dec_out = apply_hysteresis(dec_wish, dec_signals, state.decode, dec_cfg)
    pre_why = (f"prompt backlog {snapshot.prompt_backlog_tokens:,} tokens at "
               f"{config.prefill_tokens_per_s:,.0f} tokens/s per replica (need {backlog}); ")
    dec_why = f"kv {dec_load.mean_kv_usage:.2f} vs {config.kv_target:g} (need {kv}); "
    pre_reason = pre_why + explain(pre_out, pre_signals, pre_needs, NO_STANDBYS, pre_cfg)
    dec_reason = dec_why + explain(dec_out, dec_signals, dec_needs, NO_STANDBYS, dec_cfg)
    head = f"prefill {pre_out.action}; decode {dec_out.action}"
    if notes:
        head += " (" + "; ".join(notes) + ")"
    joint = f"{head} | prefill: {pre_reason} | decode: {dec_reason}"
    # Each pool's own reason leads with its own action (what its gauges and log lines read), then
    # the one joint reason.
    decision = PoolsDecision(prefill=_decision(pre_out, f"{pre_out.action} | {joint}"),
                             decode=_decision(dec_out, f"{dec_out.action} | {joint}"), reason=joint)
    return decision, PoolsState(pre_out.state, dec_out.state)


def _with(needs: Needs, extra: int) -> Needs:
    """`needs` with a pool's own symptom (the prompt backlog, the KV) beside the queue's: both
    are work waiting on the pool now, so they share the queue's delay and its reason slot."""
    return replace(needs, queue=max(needs.queue, extra))


def _decision(outcome: Outcome, reason: str) -> ScaleDecision:
    return ScaleDecision(target_active=outcome.target,
                         target_standby={Tier.HOT: 0, Tier.WARM: 0, Tier.COLD: 0}, reason=reason)


__all__ = ["PoolsConfig", "PoolsDecision", "PoolsSnapshot", "PoolsState", "backlog_need", "decide_pools",
           "kv_need", "pool_config"]
