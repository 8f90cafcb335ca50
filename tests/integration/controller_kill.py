"""Kill the Serve controller of the local head and report what the autoscaler remembered
(tests/integration/test_autoscale_live_parity.py, issue 38 requirement 1). Run as a script, a Ray
driver of its own (the test process drives the cluster through the CLI, as a user does):

    python tests/integration/controller_kill.py MODEL

Prints one JSON line: the saved envelope and the last decision before the kill, and after it
the first decision of the restarted controller and the envelope it saved next.
"""

from __future__ import annotations

import json
import re
import sys
import time

from hbmserve.cluster import ray_cluster as rc

BUCKETS = re.compile(r"burst envelope: peak [\d.]+ rps over (\d+) buckets")


def _buckets(reason: str) -> int | None:
    m = BUCKETS.search(reason)
    return int(m.group(1)) if m else None


def main(model: str, timeout_s: float = 90.0) -> dict:
    rc.connect(None)
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    from hbmserve.deployments.wire.names import engine_deployment_name
    from hbmserve.deployments.wire.records_store import latest_decision, saved_envelope

    deployment = engine_deployment_name(model)
    saved = saved_envelope(model, deployment)
    before = latest_decision(model, deployment)
    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    killed_at = time.time()
    ray.kill(controller, no_restart=False)  # Serve's controller restarts itself, its memory gone
    after, deadline = None, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = latest_decision(model, deployment)
        if got is not None and got.at > killed_at + 1.0:
            after = got
            break
        time.sleep(0.5)
    resaved = None
    while after is not None and time.monotonic() < deadline:
        resaved = saved_envelope(model, deployment)
        if resaved is not None and resaved != saved:
            break
        time.sleep(0.5)
    return {"saved_before": saved, "before_at": before.at if before else None,
            "buckets_before": _buckets(before.reason) if before else None,
            "killed_at": killed_at, "after_at": after.at if after else None,
            "buckets_after": _buckets(after.reason) if after else None,
            "reason_after": after.reason[:400] if after else None, "saved_after": resaved}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))  # noqa: T201 - the test reads this line
