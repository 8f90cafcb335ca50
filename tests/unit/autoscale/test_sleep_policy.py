"""The pure sleep decision (autoscale/sleep_policy.py): properties over every input and over
sequences of them, checked by replaying the decisions on a model engine."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hbmserve.autoscale.sleep_policy import SleepAction, sleep_step
from hbmserve.core.scaling import ReplicaState

roles = st.sampled_from([ReplicaState.ACTIVE, ReplicaState.STANDBY])
in_flights = st.integers(min_value=0, max_value=50)


def after(sleeping: bool, action: SleepAction) -> bool:
    """Whether the engine sleeps once the action is done."""
    return {SleepAction.SLEEP: True, SleepAction.WAKE: False, SleepAction.STAY: sleeping}[action]


@given(role=roles, enabled=st.booleans(), sleeping=st.booleans(), in_flight=in_flights)
def test_one_decision(role, enabled, sleeping, in_flight):
    step = sleep_step(role, sleep_enabled=enabled, sleeping=sleeping, in_flight=in_flight)
    asleep = after(sleeping, step.action)
    # Never falls asleep with a request in flight (vLLM's sleep would abort it).
    assert not (step.action is SleepAction.SLEEP and in_flight > 0)
    # An active replica is awake once the step is done; so is one with requests to answer.
    if role is ReplicaState.ACTIVE or in_flight > 0:
        assert not asleep
    # An idle standby of a sleeping pool sleeps; without sleep mode nothing ever falls asleep.
    if role is ReplicaState.STANDBY and in_flight == 0:
        assert asleep == enabled
    if not enabled:
        assert step.action is not SleepAction.SLEEP
    # Only real transitions: no sleep when asleep, no wake when awake.
    assert step.action is not (SleepAction.SLEEP if sleeping else SleepAction.WAKE)
    assert step.reason


@given(st.lists(st.tuples(roles, in_flights), min_size=1, max_size=40))
def test_a_replica_following_its_role_over_time(ticks):
    """Replayed tick by tick: never asleep while serving, and every sleep and wake alternate."""
    sleeping, actions = False, []
    for role, in_flight in ticks:
        step = sleep_step(role, sleep_enabled=True, sleeping=sleeping, in_flight=in_flight)
        assert not (step.action is SleepAction.SLEEP and in_flight > 0)
        sleeping = after(sleeping, step.action)
        assert not (sleeping and (role is ReplicaState.ACTIVE or in_flight > 0))
        actions += [step.action] if step.action is not SleepAction.STAY else []
    # Starting awake: sleep, wake, sleep, ... never twice the same in a row.
    assert actions == [SleepAction.SLEEP if i % 2 == 0 else SleepAction.WAKE for i in range(len(actions))]


def test_the_reasons_name_the_cases():
    standby, active = ReplicaState.STANDBY, ReplicaState.ACTIVE
    assert sleep_step(standby, sleep_enabled=True, sleeping=False, in_flight=3).reason == \
        "standby, draining 3 request(s) before sleeping"
    assert sleep_step(active, sleep_enabled=True, sleeping=True, in_flight=0).reason == "promoted: wake before serving"
    assert sleep_step(standby, sleep_enabled=True, sleeping=True, in_flight=2).action is SleepAction.WAKE
