"""A replica's engine asleep while it stands by, awake while it serves: the live driver of
autoscale/sleep_policy.py `sleep_step`.

Two pieces, both on the replica's event loop:

* `AwakeGate`: the replica middleware passes every generation request through it. Open while
  the engine is awake (one `is_set()` per request); closed while it sleeps or is falling asleep,
  when a request waits there, counted in flight, until the engine is awake again.
* `StandbySleep`: every tick (and at once when a request waits at the closed gate) reads the
  replica's role, asks `sleep_step` what to do and does it through the engine server's
  `sleep()` / `wake_up()` (engine_server.py), one at a time. It times each wake (`wake_s`), which
  the replica reports to the autoscaling policy as the sleeping tier's measured start-up.

The promotion race. The front doors route to a replica as soon as the decision lists it active,
which may be before the replica itself has read that decision (both poll the same record). A
request that arrives while the engine sleeps is not refused: it waits at the gate and nudges the
controller, which wakes the engine (a request in flight always wakes it, `sleep_step`); the
request then goes through, its wait counted in its TTFT. So a promoted replica is never routed
to asleep without waking, and no request is dropped for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Protocol

from hbmserve.autoscale.sleep_policy import SleepAction, SleepStep, sleep_step
from hbmserve.core.scaling import ReplicaState

log = logging.getLogger("hbmserve.deployments.replica")

# How often a replica reads its role: the front doors read the decision as often (front_door.py
# DISCOVER_S), so a demoted standby falls asleep about as soon as traffic stops reaching it.
ROLE_POLL_S = 0.5


class AwakeGate:
    """Open while the engine is awake; requests wait while it is closed."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._wanted = asyncio.Event()  # a request is waiting at the closed gate

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.clear()

    async def pass_through(self) -> None:
        """Return at once while open; else wait until opened, having asked for a wake."""
        if self._open.is_set():
            return
        self._wanted.set()
        await self._open.wait()

    async def wanted(self, timeout_s: float) -> None:
        """Until a request waits at the closed gate, or `timeout_s`."""
        try:
            await asyncio.wait_for(self._wanted.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
        self._wanted.clear()


class Sleeper(Protocol):
    """The engine server's part (engine_server.py EngineServer.sleep / wake_up)."""

    async def sleep(self) -> None: ...

    async def wake_up(self) -> None: ...


class StandbySleep:
    """Drives one engine's sleep from the replica's role. `in_flight`: the replica's requests
    admitted and not finished (LoadCounters.in_flight, held ones included)."""

    def __init__(self, engine: Sleeper, gate: AwakeGate, in_flight: Callable[[], int], enabled: bool) -> None:
        self.engine, self.gate, self.in_flight = engine, gate, in_flight
        self.enabled = enabled
        self.sleeping = False
        self.wake_s: float | None = None  # the last wake, seconds from wake_up() called to done
        self.failed: str | None = None  # a wake that failed: the replica is unhealthy
        self._lock = asyncio.Lock()

    async def step(self, role: ReplicaState) -> SleepStep:
        """Decide for `role` now and do it; one step at a time."""
        async with self._lock:
            decided = sleep_step(role, sleep_enabled=self.enabled, sleeping=self.sleeping,
                                 in_flight=self.in_flight())
            if decided.action is SleepAction.SLEEP:
                await self._sleep(decided.reason)
            elif decided.action is SleepAction.WAKE:
                await self._wake(decided.reason)
            return decided

    async def _sleep(self, why: str) -> None:
        # Closed before the first await: `sleep_step` saw nothing in flight, and from here a new
        # request waits at the gate instead of reaching an engine that is falling asleep.
        self.gate.close()
        try:
            await self.engine.sleep()
        except Exception as err:  # noqa: BLE001 - an engine that cannot sleep stays a loaded standby
            log.warning("the engine could not sleep; this standby stays loaded: %s", err)
            self.enabled = False
            self.gate.open()
            return
        self.sleeping = True
        log.info("engine asleep: %s", why)

    async def _wake(self, why: str) -> None:
        started = time.monotonic()
        try:
            await self.engine.wake_up()
        except Exception as err:  # noqa: BLE001 - reported as unhealthy: Serve replaces the replica
            self.failed = f"the engine failed to wake: {err}"
            log.error(self.failed)
            self.gate.open()  # the held requests get the engine's error rather than hang
            return
        self.wake_s = time.monotonic() - started
        self.sleeping = False
        self.gate.open()
        log.info("engine awake in %.2f s: %s", self.wake_s, why)

    async def run(self, read_role: Callable[[], Awaitable[ReplicaState]], period_s: float = ROLE_POLL_S) -> None:
        """The replica's loop: step every `period_s`, or at once when a request waits while asleep.
        A role that cannot be read (a KV hiccup) leaves the last one in place."""
        role = ReplicaState.ACTIVE
        while self.failed is None:
            try:
                role = await read_role()
            except Exception:  # noqa: BLE001 - retried next tick
                log.warning("could not read this replica's role", exc_info=True)
            await self.step(role)
            await self.gate.wanted(period_s)
