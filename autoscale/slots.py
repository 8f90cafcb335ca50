"""Which planned replica slots run for a replica target. Pure.

A model that is both autoscaled and placed by the planner has `max_replicas` planned slots, each
its own Serve deployment pinned to its NVLink island (deployments/apps/placed_app.py). The policy's
answer is one number, the replicas to run (active + hot standbys); this turns it into a 0/1 per
slot. Slots fill lowest first, so scale-down always removes the highest slots first, and the
replica that Serve stops is known in advance: the roles (roles.py) are assigned among the
replicas that stay, and the leaving ones are out of rotation the moment the decision is made.
"""

from __future__ import annotations

from collections.abc import Mapping


def slot_targets(target: int, slots: int) -> tuple[int, ...]:
    """Replicas per slot (0 or 1) for `target` replicas over `slots` slots; clamped to [0, slots]."""
    running = min(max(0, target), slots)
    return tuple(1 if k < running else 0 for k in range(slots))


def slot_min_replicas(min_replicas: int, slot: int) -> int:
    """The floor Serve keeps for one slot's deployment: the lowest `min_replicas` slots never
    go to zero, so the model's floor holds even while the policy is not running."""
    return 1 if slot < min_replicas else 0


def leaving(slot_of: Mapping[str, int], target: int) -> frozenset[str]:
    """Running replicas (id -> slot) that `target` stops: those in slots at or above it."""
    return frozenset(r for r, k in slot_of.items() if k >= max(0, target))
