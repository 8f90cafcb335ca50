"""What a platform engineer on Kubernetes would deploy instead of hbmserve: the
HorizontalPodAutoscaler on queue depth per replica, and KEDA on queue length. Same shape as every
policy here: decide(snapshot, config, state) -> (ScaleDecision with its reason, state).

Each mirrors the defaults a user gets without writing a `behavior` section, as the upstream
documents them (autoscaling/v2 API reference, `HorizontalPodAutoscalerBehavior` and
`HPAScalingRules`; kubernetes.io "Horizontal Pod Autoscaling"; keda.sh "ScaledObject
specification" and "Scaling Deployments"):

* **k8s-hpa** (`hpa_decide`). The controller syncs every 15 s (kube-controller-manager
  `--horizontal-pod-autoscaler-sync-period`). A Pods metric with an AverageValue target:
  desired = ceil(ready pods x (mean queue per ready pod / target)), nothing when that ratio is
  within the 10 % tolerance of 1. Pods still starting report no metric: on a scale-up they
  count as an empty queue, on a scale-down as exactly the target, and if that flips the
  direction or lands inside the tolerance, the count holds. Stabilization: scale-up 0 s (the
  latest recommendation), scale-down 300 s (never below the highest recommendation of the last
  5 minutes). Rate: scale-up by at most max(4 pods, 100 %) per 15 s, scale-down by up to 100 %
  per 15 s (`selectPolicy: Max`). minReplicas >= 1: scaling to zero needs the alpha
  `HPAScaleToZero` feature gate, which is why KEDA exists.
* **keda** (`keda_decide`). A ScaledObject with one queue-length trigger (a Prometheus query
  of the requests waiting, say) whose threshold is the queue per replica: KEDA polls it every
  30 s (`pollingInterval`); the trigger is active when the queue is above
  `activationThreshold` (0). KEDA itself moves 0 -> 1 on an active poll and N -> 0 once no poll
  has been active for `cooldownPeriod` (300 s, only when `minReplicaCount` is 0); between 1 and
  N it is the HPA that KEDA creates, with Kubernetes' default behaviour above, on an External
  metric with an AverageValue target: desired = ceil(queue length / threshold), held inside the
  tolerance of ceil(queue / (threshold x current)) (no missing-pod rule for External metrics).

Both read the queue as hbmserve and queue-threshold do (`baselines.queue_length`): requests
waiting at active replicas plus those held at the ingress. Simplification: the rate limits
count only scale events this policy made (as the HPA's own event history does), and the
current replica count is the policy's last target (the Deployment's `spec.replicas`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hbmserve.autoscale.baselines import queue_length
from hbmserve.core.scaling import ReplicaState, ScaleDecision, Snapshot


@dataclass(frozen=True)
class HpaConfig:
    """An autoscaling/v2 HorizontalPodAutoscaler with no `behavior`: Kubernetes' defaults."""

    min_replicas: int = 1
    max_replicas: int = 16
    target_queue_per_replica: float = 4.0  # the Pods metric's AverageValue target
    tolerance: float = 0.1  # --horizontal-pod-autoscaler-tolerance
    sync_period_s: float = 15.0  # --horizontal-pod-autoscaler-sync-period
    scale_up_stabilization_s: float = 0.0
    scale_down_stabilization_s: float = 300.0
    scale_up_pods: int = 4  # per policy_period_s
    scale_up_percent: float = 100.0  # per policy_period_s
    scale_down_percent: float = 100.0  # per policy_period_s
    policy_period_s: float = 15.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"an HPA needs 1 <= minReplicas ({self.min_replicas}) <= "
                             f"maxReplicas ({self.max_replicas})")
        if not self.target_queue_per_replica > 0:
            raise ValueError("target_queue_per_replica must be > 0")


@dataclass(frozen=True)
class HpaState:
    spec: int | None = None  # the Deployment's spec.replicas, once the HPA has set it
    last_sync_at: float | None = None
    recommendations: tuple[tuple[float, int], ...] = ()  # (time, raw desired) per sync
    events: tuple[tuple[float, int], ...] = ()  # (time, change in replicas) per scale


def _within(ratio: float, tolerance: float) -> bool:
    return abs(ratio - 1.0) <= tolerance


def pods_metric_desired(snapshot: Snapshot, config: HpaConfig,
                        current: int) -> tuple[int, str]:
    """The replica calculator for a Pods metric (queue per pod) with an AverageValue target."""
    ready = snapshot.count(ReplicaState.ACTIVE)
    missing = snapshot.count(ReplicaState.STARTING)
    queue, target = float(queue_length(snapshot)), config.target_queue_per_replica
    if ready == 0:
        return current, "no ready pod reports the metric"
    ratio = queue / ready / target
    how = f"queue {queue:g} over {ready} ready = {queue / ready:.2f}/pod, target {target:g}"
    if missing == 0:
        if _within(ratio, config.tolerance):
            return current, f"{how}: ratio {ratio:.2f} within tolerance"
        return math.ceil(ratio * ready), f"{how}: ratio {ratio:.2f}"
    # Pods without metrics: an empty queue on a scale-up, the target on a scale-down.
    fill = target if ratio < 1.0 else 0.0
    pods = ready + missing
    new_ratio = (queue + missing * fill) / pods / target
    how += f"; {missing} starting counted at {fill:g}: ratio {ratio:.2f} -> {new_ratio:.2f}"
    if _within(new_ratio, config.tolerance) or (ratio < 1.0) != (new_ratio < 1.0):
        return current, how + " (hold)"
    desired = math.ceil(new_ratio * pods)
    if (new_ratio < 1.0 and desired > current) or (new_ratio > 1.0 and desired < current):
        return current, how + " (hold)"
    return desired, how


def external_metric_desired(queue: float, config: HpaConfig, current: int) -> tuple[int, str]:
    """The replica calculator for an External metric (queue length) with an AverageValue
    target, as KEDA feeds the HPA it creates."""
    target = config.target_queue_per_replica
    how = f"queue {queue:g}, target {target:g}/replica"
    if current > 0 and _within(queue / (target * current), config.tolerance):
        return current, how + " within tolerance"
    return math.ceil(queue / target), how


def _stabilize(now: float, current: int, desired: int, config: HpaConfig,
               recs: tuple[tuple[float, int], ...]) -> int:
    """No higher than the lowest recommendation inside the scale-up window, no lower than the
    highest inside the scale-down window (the current one included in both)."""
    up = min([desired, *(n for t, n in recs if t > now - config.scale_up_stabilization_s)])
    down = max([desired, *(n for t, n in recs if t > now - config.scale_down_stabilization_s)])
    return min(max(current, up), down)


def _rate_limits(now: float, current: int, config: HpaConfig,
                 events: tuple[tuple[float, int], ...]) -> tuple[int, int]:
    """(lowest, highest) replicas allowed now: the policies over the last period, then the
    bounds."""
    recent = [d for t, d in events if t > now - config.policy_period_s]
    start_up = current - sum(d for d in recent if d > 0)
    start_down = current - sum(d for d in recent if d < 0)
    high = max(start_up + config.scale_up_pods,
               math.ceil(start_up * (1 + config.scale_up_percent / 100.0)))
    low = math.floor(start_down * (1 - config.scale_down_percent / 100.0))
    return (max(config.min_replicas, min(low, current)),
            min(config.max_replicas, max(high, current)))


def hpa_step(now: float, current: int, desired: int, how: str, config: HpaConfig,
             state: HpaState, label: str = "k8s-hpa") -> tuple[ScaleDecision, HpaState]:
    """One sync: record the raw recommendation, stabilize it, limit its rate, bound it."""
    keep = max(config.scale_up_stabilization_s, config.scale_down_stabilization_s)
    recs = tuple((t, n) for t, n in state.recommendations if t > now - keep)
    stable = _stabilize(now, current, desired, config, recs)
    low, high = _rate_limits(now, current, config, state.events)
    target = max(low, min(high, stable))
    events = tuple((t, d) for t, d in state.events if t > now - config.policy_period_s)
    if target != current:
        events += ((now, target - current),)
    state = replace(state, spec=target, last_sync_at=now, recommendations=recs + ((now, desired),),
                    events=events)
    reason = (f"{label} {current}→{target}: {how}; desired {desired}, stabilized {stable} "
              f"(highest of the last {config.scale_down_stabilization_s:g} s), allowed "
              f"[{low}, {high}]")
    return ScaleDecision(target_active=target, reason=reason), state


def _hold(label: str, current: int, why: str) -> ScaleDecision:
    return ScaleDecision(target_active=current, reason=f"{label} {current}→{current}: {why}")


def _spec(snapshot: Snapshot, state: HpaState) -> int:
    if state.spec is not None:
        return state.spec
    return snapshot.count(ReplicaState.ACTIVE) + snapshot.count(ReplicaState.STARTING)


def hpa_decide(snapshot: Snapshot, config: HpaConfig,
               state: HpaState) -> tuple[ScaleDecision, HpaState]:
    now, current = snapshot.now, _spec(snapshot, state)
    if state.last_sync_at is not None and now - state.last_sync_at < config.sync_period_s:
        return _hold("k8s-hpa", current, "between syncs"), state
    if current == 0:  # the HPA is disabled while its target has no replica
        return _hold("k8s-hpa", 0, "scaling disabled at 0 replicas"), replace(
            state, spec=0, last_sync_at=now)
    if current < config.min_replicas or current > config.max_replicas:
        bounded = max(config.min_replicas, min(config.max_replicas, current))
        return hpa_step(now, current, bounded, "out of bounds", config, state)
    desired, how = pods_metric_desired(snapshot, config, current)
    return hpa_step(now, current, desired, how, config, state)


@dataclass(frozen=True)
class KedaConfig:
    """A ScaledObject with one queue-length trigger and KEDA's defaults."""

    min_replicas: int = 0  # minReplicaCount
    max_replicas: int = 100  # maxReplicaCount
    target_queue_length: float = 4.0  # the trigger's threshold: queue per replica
    activation_queue_length: float = 0.0  # activationThreshold: active above this
    polling_interval_s: float = 30.0  # pollingInterval
    cooldown_s: float = 300.0  # cooldownPeriod: inactive this long before scaling to 0

    @property
    def hpa(self) -> HpaConfig:
        """The HPA KEDA creates for 1 <-> N: no behaviour set, so Kubernetes' defaults."""
        return HpaConfig(min_replicas=max(1, self.min_replicas), max_replicas=self.max_replicas,
                         target_queue_per_replica=self.target_queue_length)


@dataclass(frozen=True)
class KedaState:
    hpa: HpaState = HpaState()
    last_poll_at: float | None = None
    last_active_at: float | None = None


def _keda_poll(now: float, current: int, queue: float, config: KedaConfig,
               state: KedaState) -> tuple[int | None, str, KedaState]:
    """KEDA's own step on a poll: 0 -> 1 when the trigger is active, N -> 0 once it has been
    inactive for the cooldown (minReplicaCount 0 only); None: leave it to the HPA."""
    active = queue > config.activation_queue_length
    state = replace(state, last_poll_at=now, last_active_at=now if active else state.last_active_at)
    if current == 0 and active:
        return (max(1, config.min_replicas),
                f"activated: queue {queue:g} > {config.activation_queue_length:g}", state)
    idle = state.last_active_at is None or now - state.last_active_at >= config.cooldown_s
    if current > 0 and not active and config.min_replicas == 0 and idle:
        return 0, f"inactive for the {config.cooldown_s:g} s cooldown", state
    return None, "", state


def keda_decide(snapshot: Snapshot, config: KedaConfig,
                state: KedaState) -> tuple[ScaleDecision, KedaState]:
    now, current = snapshot.now, _spec(snapshot, state.hpa)
    queue = float(queue_length(snapshot))
    if state.last_poll_at is None or now - state.last_poll_at >= config.polling_interval_s:
        target, why, state = _keda_poll(now, current, queue, config, state)
        if target is not None:
            reason = (f"keda {current}→{target}: {why} (polled every "
                      f"{config.polling_interval_s:g} s)")
            return (ScaleDecision(target_active=target, reason=reason),
                    replace(state, hpa=replace(state.hpa, spec=target)))
    if current == 0:
        return _hold("keda", 0, "scaled to zero, waiting for an active poll"), state
    hpa, hs = config.hpa, state.hpa
    if hs.last_sync_at is not None and now - hs.last_sync_at < hpa.sync_period_s:
        return _hold("keda", current, "between HPA syncs"), state
    desired, how = external_metric_desired(queue, hpa, current)
    decision, hs = hpa_step(now, current, desired, how, hpa, hs, label="keda (its HPA)")
    return decision, replace(state, hpa=hs)
