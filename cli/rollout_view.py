"""`hbmserve deploy` onto a running cluster (cluster/rolling_deploy.py) and the rollout lines of `status`."""

from __future__ import annotations

import time

from rich.console import Console

from hbmserve.cli.user_errors import EXIT_FAILED, fail
from hbmserve.core.config import ClusterSpec
from hbmserve.core.rollout_records import RolloutRecord

NOTHING_DEPLOYED = "nothing is deployed yet"


def update_running(spec: ClusterSpec, err: Console, out: Console) -> str | None:
    """Roll what changed onto the running deployment and return the front doors' URL; None when
    everything must redeploy instead (said why, unless nothing was deployed). Exits 1 when a
    model rolled back."""
    from hbmserve.cluster.local_head import ClusterError
    from hbmserve.cluster.rolling_deploy import update

    t0 = time.monotonic()
    try:
        with err.status("rolling the changed models") as progress:
            result = update(spec, lambda r: progress.update(f"{r.model}: {r.reason}"))
    except ClusterError as e:
        raise fail(str(e), EXIT_FAILED) from None
    if isinstance(result, str):
        if result != NOTHING_DEPLOYED:
            err.print(f"[yellow]redeploying everything:[/] {result}; the front doors restart and open streams end",
                      highlight=False)
        return None
    for r in result.rollouts:
        out.print(rollout_line(r), highlight=False, soft_wrap=True)
    if result.unchanged:
        out.print(f"unchanged, left running: {', '.join(result.unchanged)}", highlight=False)
    err.print(f"deployed in {time.monotonic() - t0:.0f} s; front doors at {result.url}", style="dim",
              highlight=False)
    if result.rolled_back:
        raise fail("; ".join(f"{r.model} rolled back: {_why(r)}" for r in result.rolled_back), EXIT_FAILED)
    return result.url


def _why(r: RolloutRecord) -> str:
    """The reason the rollback began (the first rolling-back step says it)."""
    return next((s.reason for s in r.steps if s.reason.startswith("rolling back")), r.reason)


def rollout_line(r: RolloutRecord) -> str:
    took = r.at - r.started_at
    done = f"updated in place by Serve in {took:.0f} s" if r.from_app == r.to_app else f"rolled to {r.to_app} in {took:.0f} s"
    verdict = {"done": done, "rolled_back": f"[red]rolled back[/] after {took:.0f} s",
               }.get(r.phase, f"{r.phase.replace('_', ' ')} ({took:.0f} s so far)")
    return (f"[bold]{r.model}[/] rollout {r.from_app} -> {r.to_app}: {verdict}; at most {r.max_in_use} replicas "
            f"held (fleet {r.target}); {len(r.steps)} steps; last: {r.reason}")


def print_rollouts(out: Console, records: list[RolloutRecord]) -> None:
    for r in records:
        out.print(rollout_line(r), highlight=False, soft_wrap=True)
