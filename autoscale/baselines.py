"""Baseline policies with the same shape as hbmserve's: decide(snapshot, config, state).

* ray_default_decide: Ray Serve 2.60's default policy, `target_ongoing_requests`, mirrored from
  the installed source (ray/serve/autoscaling_policy.py, ray/serve/_private/autoscaling_state.py,
  ray/serve/config.py); each step cites the function it mirrors.
* static_peak_decide: a fixed replica count, provisioned for the trace's peak.
* queue_threshold_decide: +1 above a queue-length threshold, -1 below another, with a cool-down.

What a Kubernetes user would run instead (the HPA, KEDA) is in k8s_baselines.py; the static
frontier (every fixed fleet, static-peak's decide at each count) in capacity/sim/frontier.py. None keeps
standbys: their decisions carry an empty target_standby.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from hbmserve.core.scaling import ReplicaState, ScaleDecision, Snapshot

# ray/serve/autoscaling_policy.py: _DELAY_ELAPSED_EPS_S
_DELAY_ELAPSED_EPS_S = 1e-6


class Aggregation(str, Enum):
    MEAN = "mean"
    MAX = "max"
    MIN = "min"


@dataclass(frozen=True)
class RayDefaultConfig:
    """ray.serve.config.AutoscalingConfig's fields and defaults (Ray 2.60)."""

    min_replicas: int = 1
    max_replicas: int = 1
    target_ongoing_requests: float = 2.0  # _private/constants.py DEFAULT_TARGET_ONGOING_REQUESTS
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    smoothing_factor: float = 1.0
    upscale_smoothing_factor: float | None = None
    downscale_smoothing_factor: float | None = None
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    look_back_period_s: float = 30.0
    aggregation_function: Aggregation = Aggregation.MEAN
    metrics_interval_s: float = 10.0  # DEFAULT_METRICS_INTERVAL_S: the push period
    # RAY_SERVE_AUTOSCALING_METRIC_RECORD_INTERVAL_FACTOR: points are recorded every
    # min(look_back_period_s * 0.2, metrics_interval_s) seconds (replica.py, router.py).
    record_interval_factor: float = 0.2

    # AutoscalingConfig.get_upscaling_factor / get_downscaling_factor
    def get_upscaling_factor(self) -> float:
        if self.upscaling_factor:
            return self.upscaling_factor
        return self.upscale_smoothing_factor or self.smoothing_factor

    def get_downscaling_factor(self) -> float:
        if self.downscaling_factor:
            return self.downscaling_factor
        return self.downscale_smoothing_factor or self.smoothing_factor

    @property
    def record_interval_s(self) -> float:
        return min(self.look_back_period_s * self.record_interval_factor, self.metrics_interval_s)


@dataclass(frozen=True)
class RayDefaultState:
    target_num_replicas: int | None = None  # the deployment's current target
    # policy_state[SERVE_AUTOSCALING_DECISION_COUNTERS_KEY / _TIMESTAMP_KEY]
    decision_counter: int = 0
    decision_timestamp: float | None = None
    # Points of total ongoing requests recorded at the replicas/handles, and the last push:
    # the controller only sees what was pushed (metrics_interval_s apart).
    recorded: tuple[tuple[float, float], ...] = ()
    last_record_at: float | None = None
    pushed: tuple[tuple[float, float], ...] = ()
    last_push_at: float | None = None


def _total_ongoing(snapshot: Snapshot) -> float:
    """Ray counts requests running or queued at running replicas plus those queued at handles."""
    at_replicas = sum(r.waiting + r.running for r in snapshot.replicas
                      if r.state is ReplicaState.ACTIVE)
    return float(at_replicas + snapshot.pending_at_ingress)


def queue_length(snapshot: Snapshot) -> int:
    """Requests waiting: queued at active replicas plus held at the ingress (no replica active)."""
    return sum(r.waiting for r in snapshot.replicas
               if r.state is ReplicaState.ACTIVE) + snapshot.pending_at_ingress


def _observe(snapshot: Snapshot, config: RayDefaultConfig,
             state: RayDefaultState) -> RayDefaultState:
    now, total = snapshot.now, _total_ongoing(snapshot)
    recorded, last_record = state.recorded, state.last_record_at
    if last_record is None or now - last_record >= config.record_interval_s:
        recorded, last_record = recorded + ((now, total),), now
    pushed, last_push = state.pushed, state.last_push_at
    active = snapshot.count(ReplicaState.ACTIVE)
    # router.py should_send_scaled_to_zero_optimized_push: with 0 replicas and a queued
    # request, the handle pushes at once (and records the point it pushes).
    zero_push = active == 0 and snapshot.pending_at_ingress > 0
    if zero_push and recorded[-1][0] != now:
        recorded = recorded + ((now, total),)
    if last_push is None or now - last_push >= config.metrics_interval_s or zero_push:
        # replica.py _push_autoscaling_metrics: prune_keys_and_compact_data(now - look_back)
        recorded = tuple(p for p in recorded if p[0] >= now - config.look_back_period_s)
        pushed, last_push = recorded, now
    return replace(state, recorded=recorded, last_record_at=last_record, pushed=pushed,
                   last_push_at=last_push)


def aggregate_pushed(points: tuple[tuple[float, float], ...], now: float,
                     aggregation: Aggregation) -> float:
    """autoscaling_state.py _merge_and_aggregate_timeseries for one merged series: a
    right-continuous step function whose last point holds until `now`
    (last_window_s = now - last point, 1e-3 if not positive)."""
    if not points:
        return 0.0
    if aggregation is Aggregation.MAX:
        return max(v for _, v in points)
    if aggregation is Aggregation.MIN:
        return min(v for _, v in points)
    last_window_s = now - points[-1][0]
    if last_window_s <= 0:
        last_window_s = 1e-3
    area, span = 0.0, 0.0
    for (t0, v0), (t1, _) in zip(points, points[1:]):
        area += v0 * (t1 - t0)
        span += t1 - t0
    area += points[-1][1] * last_window_s
    span += last_window_s
    return area / span


def _apply_scaling_factors(desired: float, current: int, config: RayDefaultConfig) -> int:
    """autoscaling_policy.py _apply_scaling_factors."""
    if current == 0:
        return math.ceil(desired)
    delta = desired - current
    factor = config.get_upscaling_factor() if delta > 0 else config.get_downscaling_factor()
    scaled = math.ceil(current + factor * delta)
    if math.ceil(float(desired)) < current and scaled == current:
        scaled -= 1
    return scaled


def _apply_delay_logic(desired: int, curr_target: int, config: RayDefaultConfig,
                       state: RayDefaultState, now: float) -> tuple[int, RayDefaultState]:
    """autoscaling_policy.py _apply_delay_logic."""
    decision = curr_target
    counter, stamp = state.decision_counter, state.decision_timestamp
    if desired > curr_target:
        if counter < 0:
            counter, stamp = 0, None
        counter += 1
        if stamp is None:
            stamp = now
        if now - stamp + _DELAY_ELAPSED_EPS_S >= config.upscale_delay_s:
            counter, stamp, decision = 0, None, desired
    elif desired < curr_target:
        if counter > 0:
            counter, stamp = 0, None
        counter -= 1
        if curr_target == 1 and config.downscale_to_zero_delay_s is not None:
            delay_s = config.downscale_to_zero_delay_s
        else:
            delay_s = config.downscale_delay_s
            if curr_target != 1:
                desired = max(1, desired)  # only 1 -> 0 may reach zero
        if stamp is None:
            stamp = now
        if now - stamp + _DELAY_ELAPSED_EPS_S >= delay_s:
            counter, stamp, decision = 0, None, desired
    else:
        counter, stamp = 0, None
    return decision, replace(state, decision_counter=counter, decision_timestamp=stamp)


def ray_default_decide(snapshot: Snapshot, config: RayDefaultConfig,
                       state: RayDefaultState) -> tuple[ScaleDecision, RayDefaultState]:
    now = snapshot.now
    state = _observe(snapshot, config, state)
    current = snapshot.count(ReplicaState.ACTIVE)  # AutoscalingContext.current_num_replicas
    target = state.target_num_replicas
    if target is None:
        target = current + snapshot.count(ReplicaState.STARTING)
    total = aggregate_pushed(state.pushed, now, config.aggregation_function)

    if current == 0 and total > 0:
        # _get_cold_start_scale_up_replicas: bypasses factors and delays.
        raw = max(math.ceil(1 * config.get_upscaling_factor()), target)
        how = f"cold start: 0 running, {total:.2f} ongoing"
    else:
        # _core_replica_queue_length_policy
        if current == 0:
            desired: float = target
        else:
            desired = current * (total / (config.target_ongoing_requests * current))
        # _apply_default_params
        scaled = _apply_scaling_factors(desired, current, config)
        if current == 0 and scaled > 0:
            raw = scaled
        else:
            raw, state = _apply_delay_logic(max(0, scaled), target, config, state, now)
        how = (f"{total:.2f} ongoing (window mean) / target_ongoing_requests "
               f"{config.target_ongoing_requests:g} = {desired:.2f} desired; after factors "
               f"{scaled}; delay counter {state.decision_counter}")
    # AutoscalingState.get_decision_num_replicas: ceil a float, then apply_bounds.
    bounded = max(config.min_replicas, min(config.max_replicas, math.ceil(raw)))
    state = replace(state, target_num_replicas=bounded)
    reason = (f"ray-default {target}→{bounded}: {how}; bounds "
              f"[{config.min_replicas}, {config.max_replicas}]")
    return ScaleDecision(target_active=bounded, reason=reason), state


@dataclass(frozen=True)
class StaticPeakConfig:
    replicas: int


@dataclass(frozen=True)
class StaticPeakState:
    pass


def static_peak_decide(snapshot: Snapshot, config: StaticPeakConfig,
                       state: StaticPeakState) -> tuple[ScaleDecision, StaticPeakState]:
    reason = f"static-peak: always {config.replicas} replicas (provisioned for the peak)"
    return ScaleDecision(target_active=config.replicas, reason=reason), state


@dataclass(frozen=True)
class QueueThresholdConfig:
    min_replicas: int = 1
    max_replicas: int = 16
    scale_up_queue: float = 4.0  # mean waiting per active replica above this: +1
    scale_down_queue: float = 0.5  # below this: -1
    cooldown_s: float = 60.0  # between any two changes


@dataclass(frozen=True)
class QueueThresholdState:
    target: int | None = None
    last_change_at: float | None = None


def queue_threshold_decide(snapshot: Snapshot, config: QueueThresholdConfig,
                           state: QueueThresholdState
                           ) -> tuple[ScaleDecision, QueueThresholdState]:
    now = snapshot.now
    active = snapshot.count(ReplicaState.ACTIVE)
    current = state.target if state.target is not None else (
        active + snapshot.count(ReplicaState.STARTING))
    queue = queue_length(snapshot) / max(active, 1)
    cooled = state.last_change_at is None or now - state.last_change_at >= config.cooldown_s
    target, why = current, "hold"
    if current == 0 and snapshot.pending_at_ingress > 0:
        target, why = 1, "scale from zero"
    elif queue > config.scale_up_queue and cooled:
        target, why = current + 1, f"queue {queue:.1f} > {config.scale_up_queue:g}"
    elif queue < config.scale_down_queue and cooled:
        target, why = current - 1, f"queue {queue:.1f} < {config.scale_down_queue:g}"
    target = max(config.min_replicas, min(config.max_replicas, target))
    changed = target != current
    new = QueueThresholdState(target=target,
                              last_change_at=now if changed else state.last_change_at)
    reason = f"queue-threshold {current}→{target}: {why} (queue {queue:.1f}/replica)"
    return ScaleDecision(target_active=target, reason=reason), new
