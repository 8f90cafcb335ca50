"""The clairvoyant baseline: a replica schedule planned from the whole trace, replayed.

    oracle_decide(snapshot, config, state) -> (ScaleDecision, state)

reads the target off `config.schedule` at `snapshot.now`; nothing in the snapshot matters. The
schedule is built by the driver that knows the trace (capacity/sim/oracle_search.py: the fewest replicas per
interval that meet the SLO, found with the simulator) through `cover`, which turns "replicas
needed to serve in each interval" into the cheapest schedule of replicas to hold, start-up
included.

Why `cover` is exact. Billing is per replica-second whatever the replica does (starting,
standby, serving), and a replica serves only `start_s` after it was ordered. A clairvoyant
schedule therefore keeps no standby (an active replica costs the same and serves) and orders a
cold replica exactly `start_s` before it is needed. The number held at time t is
x(t) = sum over levels j of [x(t) >= j], and the cost, sum of x(t) dt, splits the same way:
level j must serve wherever need >= j and pays its held time. Each level alone is a 1-D
problem: between two spells of need separated by a gap g, holding costs g, releasing and
re-ordering costs `start_s` (the billed start-up), so hold iff g <= start_s; the first spell
pays its start-up unless the level was already running at t=0. Solving each level so gives a
cost no schedule can undercut (it is optimal level by level, and any schedule's cost is the
sum of its levels'), and the levels nest (a gap of level j lies inside a longer gap of level
j+1), so together they are one feasible schedule.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hbmserve.core.scaling import ScaleDecision, Snapshot

# (from_s, replicas to hold: active + starting), sorted by time, the first at 0.
Schedule = tuple[tuple[float, int], ...]


@dataclass(frozen=True)
class OracleConfig:
    schedule: Schedule
    note: str = ""  # how the schedule was found, for the reason string
    _times: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.schedule or self.schedule[0][0] != 0.0:
            raise ValueError("an oracle schedule starts at t=0")
        times = tuple(t for t, _ in self.schedule)
        if list(times) != sorted(times) or any(n < 0 for _, n in self.schedule):
            raise ValueError("an oracle schedule is sorted by time with counts >= 0")
        object.__setattr__(self, "_times", times)

    def target_at(self, now: float) -> int:
        return self.schedule[max(0, bisect.bisect_right(self._times, now) - 1)][1]


@dataclass(frozen=True)
class OracleState:
    pass


def oracle_decide(snapshot: Snapshot, config: OracleConfig,
                  state: OracleState) -> tuple[ScaleDecision, OracleState]:
    target = config.target_at(snapshot.now)
    reason = (f"oracle: hold {target} (active + starting) at {snapshot.now:.0f}s, planned from "
              f"the whole trace{': ' + config.note if config.note else ''}")
    return ScaleDecision(target_active=target, reason=reason), state


def _spells(need: Sequence[int], level: int) -> list[tuple[int, int]]:
    """[first, end) bin ranges where need >= level."""
    out: list[tuple[int, int]] = []
    for k, n in enumerate(need):
        if n >= level:
            if out and out[-1][1] == k:
                out[-1] = (out[-1][0], k + 1)
            else:
                out.append((k, k + 1))
    return out


def cover(need: Sequence[int], bin_s: float, start_s: float, initial: int = 0,
          tick_s: float = 1.0, after: int = 0) -> Schedule:
    """The cheapest schedule (module docstring) that has need[k] replicas serving throughout
    bin k = [k*bin_s, (k+1)*bin_s), given `initial` replicas already serving at t=0 and
    `start_s` from order to serving. Orders fall on multiples of `tick_s` (the policy's
    period), early rather than late. Needs in the first `start_s` above `initial` cannot be met
    in time; their replicas are ordered at t=0. After the last bin, `after` are held for good
    (min_replicas)."""
    if not (bin_s > 0 and start_s >= 0 and tick_s > 0 and initial >= 0):
        raise ValueError("need bin_s > 0, start_s >= 0, tick_s > 0, initial >= 0")
    events: dict[float, int] = {0.0: 0}
    need = [*need, after]
    last = len(need) - 1
    for level in range(1, max([*need, initial]) + 1):
        spells = [(k0 * bin_s, math.inf if k1 > last else k1 * bin_s)
                  for k0, k1 in _spells(need, level)]
        if level <= initial:
            spells.insert(0, (0.0, 0.0))  # running at t=0: no start-up to pay for the first spell
        held: list[tuple[float, float]] = []
        for a, b in spells:
            if held and a - held[-1][1] <= start_s:
                held[-1] = (held[-1][0], b)  # holding through the gap costs no more than a restart
            else:
                free = level <= initial and not held
                order = a if free else max(0.0, math.floor((a - start_s) / tick_s) * tick_s)
                held.append((order, b))
        for a, b in held:  # an initial replica no spell keeps is (0, 0): released at once
            events[a] = events.get(a, 0) + 1
            if b < math.inf:
                events[b] = events.get(b, 0) - 1
    schedule, n = [], 0
    for t in sorted(events):
        n += events[t]
        if not schedule or schedule[-1][1] != n:
            schedule.append((t, n))
    return tuple(schedule)


def schedule_cost_s(schedule: Schedule, end_s: float) -> float:
    """Replica-seconds held from 0 to `end_s` (the planner's view; the simulator also bills
    draining)."""
    total = 0.0
    for (t0, n), (t1, _) in zip(schedule, [*schedule[1:], (end_s, 0)]):
        total += n * max(0.0, min(t1, end_s) - t0)
    return total
