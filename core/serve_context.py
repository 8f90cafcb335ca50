"""What the policy adapters (deployments/control/) read from Ray Serve's AutoscalingContext, as a Protocol.

Serve builds the context in its controller and hands it to the policy; the slotted path
(deployments/control/slot_autoscaling.py) builds a model-wide one itself (`ModelContext`). Both are read
through this Protocol and nothing else, so the adapters need no Ray import, and
tests/unit/deployments/control/test_policy_context.py checks that Ray's AutoscalingContext and
`ModelContext` both have every member named here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class MetricPoint(Protocol):
    """One pushed value, shaped like Serve's TimeStampedValue."""

    @property
    def timestamp(self) -> float: ...

    @property
    def value(self) -> float: ...


class PolicyContext(Protocol):
    """The members of Serve's AutoscalingContext that hbmserve reads. Replica ids are Serve's
    ReplicaID (its `unique_id` is the key hbmserve uses) or, in a merged context, that key."""

    @property
    def app_name(self) -> str | None: ...

    @property
    def deployment_name(self) -> str: ...

    @property
    def current_time(self) -> float | None: ...

    @property
    def running_replicas(self) -> Sequence[Any]: ...

    @property
    def raw_metrics(self) -> Mapping[str, Mapping[Any, Sequence[MetricPoint]]] | None: ...

    @property
    def aggregated_metrics(self) -> Mapping[str, Mapping[Any, float]] | None: ...

    @property
    def target_num_replicas(self) -> int: ...

    @property
    def current_num_replicas(self) -> int: ...

    @property
    def policy_state(self) -> Mapping[str, Any] | None: ...


POLICY_CONTEXT_MEMBERS = ("app_name", "deployment_name", "current_time", "running_replicas", "raw_metrics",
                          "aggregated_metrics", "target_num_replicas", "current_num_replicas", "policy_state")
