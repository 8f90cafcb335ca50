"""Which running replicas take traffic and which stand by hot. Pure.

The policy decides how many replicas are active (`ScaleDecision.target_active`) and how many hot
standbys to keep; Serve runs both as one deployment and knows no difference. This picks the
replicas. An active replica listens on the model's port; a standby has its engine loaded but
no listener, so the kernel never hands it a connection until it is promoted (promotion is one
`bind`, milliseconds).

Rules, in order:
* Replicas already active stay active: moving traffic away from one means draining it.
* Missing actives are promoted from the standbys, oldest first (longest loaded).
* Surplus actives are demoted, newest first, because Ray Serve stops the newest replicas first
  when it scales down (deployment_scheduler._get_replicas_to_stop): the oldest replicas keep
  the traffic, and the ones Serve is about to stop are the ones already out of rotation.

Ages are kept as the order in which replicas were first seen (`RoleAssignment.order`), carried
in the policy state between decisions.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RoleAssignment:
    active: tuple[str, ...]
    order: tuple[str, ...]  # running replicas, oldest first
    promoted: tuple[str, ...] = ()
    demoted: tuple[str, ...] = ()

    @property
    def standby(self) -> tuple[str, ...]:
        return tuple(r for r in self.order if r not in self.active)

    def describe(self) -> str:
        parts = []
        if self.promoted:
            parts.append(f"promote {len(self.promoted)} standby")
        if self.demoted:
            parts.append(f"demote {len(self.demoted)} to standby")
        return ", ".join(parts)


def age_order(running: Collection[str], previous_order: Sequence[str]) -> tuple[str, ...]:
    """Running replicas, oldest first: those seen before in their old order, then new ones."""
    known = [r for r in previous_order if r in running]
    return tuple(known) + tuple(sorted(r for r in running if r not in set(known)))


def current_active(order: Sequence[str], previous_active: Collection[str] | None) -> tuple[str, ...]:
    """Who serves now. Before any assignment (a fresh deployment, or a restarted controller),
    every running replica listens, because that is what a replica does until told otherwise."""
    if previous_active is None:
        return tuple(order)
    return tuple(r for r in order if r in previous_active)


def assign_roles(running: Collection[str], previous_order: Sequence[str],
                 previous_active: Collection[str] | None, target_active: int) -> RoleAssignment:
    order = age_order(running, previous_order)
    keep = current_active(order, previous_active)
    standby = [r for r in order if r not in keep]
    want = max(0, target_active)
    promoted = tuple(standby[:max(0, want - len(keep))])
    kept = keep[:want]  # oldest first: the newest actives are the ones demoted
    active = tuple(r for r in order if r in kept or r in promoted)
    return RoleAssignment(active=active, order=order, promoted=promoted,
                          demoted=tuple(r for r in keep if r not in kept))
