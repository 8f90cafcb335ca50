"""Which replicas serve, which stand by hot, and which go first on a scale-down. Pure.

The policy decides how many replicas are active (`ScaleDecision.target_active`) and how many hot
standbys to keep; Serve runs both as one deployment and knows no difference. This picks the
replicas. An active replica listens on the model's port; a standby has its engine loaded but
no listener, so the kernel never hands it a connection until it is promoted (promotion is one
`bind`, milliseconds).

The scale-down victim rule, one function for both drivers (`scale_down_victims`):
replicas not yet serving first (no work, no cache), then the least in-flight work (waiting +
running) first, ties newest first. Taking a replica out of rotation costs the requests it holds:
they finish where they are (a drain) while the rest of the fleet takes the new ones, so the
least-loaded replica is the cheapest to lose and the fleet's remaining load stays largest.
Among equals the newest goes: its prefix cache is the least warmed, and Serve too stops the
newest first on a node. The simulator drains exactly these (capacity/sim/cluster_sim.py `scale_down`); live,
`assign_roles` demotes exactly these to standby.

What the rule cannot reach live: which replica Ray Serve STOPS. A custom autoscaling policy
returns only a replica count (ray/serve/_private/autoscaling_state.py:683), the downscale
request carries only `num_to_stop` (deployment_state.py:4483, deployment_scheduler.py:284),
and Serve's scheduler picks the victims (deployment_scheduler.py:1308 `_get_replicas_to_stop`,
Ray 2.60): replicas not RUNNING first, then off the head node, then on nodes that miss the
label selector, then on nodes with the fewest replicas of any deployment, and within a node
the newest first, newest meaning last to become RUNNING (:555, :1350-1353, :1384-1386).
So when the policy lowers the active target and Serve's count drops with it, the least-loaded
actives are demoted and Serve stops the newest replicas on the node it picks. On one node with
even load (the slack a scale-down waits for) these are the same replicas, because ties go
newest first. When they differ, Serve stops a replica that was still active: it drains before
it stops (replica_http.DRAIN_TIMEOUT_S, inside Serve's graceful_shutdown_timeout_s), so its
requests finish unless they outlast that, and at the next decision the active role it leaves
goes to the oldest standby, often the one just demoted. Demotions that turn actives into
standbys with no change in Serve's count (the pool keeps them) follow the rule exactly.

Other role rules:
* Replicas already active stay active unless surplus: moving traffic away means a drain.
* Missing actives are promoted from the standbys, oldest first (longest loaded).

Ages are kept as the order in which replicas were first seen (`RoleAssignment.order`), carried
in the policy state between decisions; it follows Serve's own order of running replicas.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class VictimCandidate:
    replica_id: str
    in_flight: int  # requests waiting + running on it
    started: float  # any clock or sequence of when it started: larger is newer
    serving: bool = True  # False: still starting, holds no work and serves nobody yet


def scale_down_victims(candidates: Iterable[VictimCandidate], n: int) -> tuple[str, ...]:
    """The `n` replicas to take out of service, first to go first (the rule above). Equal
    start times keep the order given."""
    ranked = sorted(candidates, key=lambda c: (c.serving, c.in_flight, -c.started))
    return tuple(c.replica_id for c in ranked[:max(0, n)])


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


@dataclass(frozen=True)
class RolesState:
    """The roles carried from one policy call to the next (in Serve's policy_state, as plain
    data): the running replicas oldest first, and which are active (None: none assigned yet,
    so every replica is)."""

    order: tuple[str, ...] = ()
    active: tuple[str, ...] | None = None

    @classmethod
    def of(cls, assignment: RoleAssignment) -> RolesState:
        return cls(order=assignment.order, active=assignment.active)

    def to_dict(self) -> dict[str, list[str] | None]:
        return {"order": list(self.order), "active": None if self.active is None else list(self.active)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, object] | None) -> RolesState:
        """Tolerates what an older hbmserve left: a missing key is an empty order or no roles."""
        raw = raw or {}
        order, active = raw.get("order") or (), raw.get("active")
        return cls(order=tuple(str(r) for r in order),  # type: ignore[union-attr]
                   active=None if active is None else tuple(str(r) for r in active))  # type: ignore[union-attr]


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


NOTHING_IN_FLIGHT: Mapping[str, int] = MappingProxyType({})


def assign_roles(running: Collection[str], previous_order: Sequence[str],
                 previous_active: Collection[str] | None, target_active: int,
                 in_flight: Mapping[str, int] = NOTHING_IN_FLIGHT) -> RoleAssignment:
    """`in_flight`: requests waiting + running per replica (absent: none); it picks which
    surplus actives are demoted (scale_down_victims)."""
    order = age_order(running, previous_order)
    keep = current_active(order, previous_active)
    standby = [r for r in order if r not in keep]
    want = max(0, target_active)
    promoted = tuple(standby[:max(0, want - len(keep))])
    age = {r: i for i, r in enumerate(order)}
    victims = set(scale_down_victims(
        (VictimCandidate(r, in_flight.get(r, 0), age[r]) for r in keep), len(keep) - want))
    active = tuple(r for r in order if (r in keep and r not in victims) or r in promoted)
    return RoleAssignment(active=active, order=order, promoted=promoted,
                          demoted=tuple(r for r in keep if r in victims))
