"""The dashboard served by the front door's ASGI app, in process: real simulated-engine replicas
on loopback (test_front_door_app's Door), no Ray. The page loads without a credential, its data
only with the admin token; streamed requests through the door show up as client-side latency,
tokens/s and replica roles in the snapshot."""

from __future__ import annotations

import asyncio
import dataclasses

from hbmserve.access.keys import parse_admin_token, parse_keys_file
from hbmserve.deployments.ingress.dashboard_feed import DashboardFeed
from tests.unit.deployments.ingress.test_front_door_app import KEY, Door, completion, run

ADMIN = "admin-token-0123456789"
RING = dataclasses.replace(parse_keys_file(f"tenants: [{{name: t, keys: ['{KEY}']}}]", "keys.yaml"),
                           admin_digest=parse_admin_token(ADMIN, "admin"))
TENANT_H, ADMIN_H = {"authorization": f"Bearer {KEY}"}, {"authorization": f"Bearer {ADMIN}"}


def test_the_page_is_public_its_data_needs_the_admin_token_and_shows_the_traffic():
    async def go():
        def wire(d):
            d.feed = DashboardFeed(d.spec, d.table, d.admission, lambda: ("node-1", 1, True))
            return {"dashboard": d.feed}

        async with Door(ring=RING, wire=wire) as d:
            feed = d.feed
            page = await d.client.get("/hbm/dashboard")
            script = await d.client.get("/hbm/dashboard/app.js")
            bare = await d.client.get("/hbm/dashboard/data")
            tenant = await d.client.get("/hbm/dashboard/data", headers=TENANT_H)
            post = await d.client.post("/hbm/dashboard/data", headers=ADMIN_H)
            streamed = await asyncio.gather(*(d.client.post(
                "/v1/completions", headers=TENANT_H,
                json=completion(max_tokens=12, stream=True, stream_options={"include_usage": True}))
                for _ in range(6)))
            await feed.refresh()  # no autoscaled model: no Ray KV read, just a sample
            data = await d.client.get("/hbm/dashboard/data", headers=ADMIN_H)
            return page, script, bare, tenant, post, [r.status_code for r in streamed], data

    page, script, bare, tenant, post, codes, data = run(go())
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/hbm/dashboard/app.js" in page.text and "http" not in page.text.split("<body>")[1].replace(
        "http://www.w3.org", "")  # nothing fetched from another host
    assert script.status_code == 200 and "drawChart" in script.text
    assert bare.status_code == 401 and tenant.status_code == 403  # deny by default: admin only
    assert post.status_code == 405
    assert codes == [200] * 6
    snap = data.json()
    assert data.status_code == 200 and snap["door"] == "node-1" and snap["auth"] is True
    (sample,) = snap["history"]
    m = next(s for s in sample["models"] if s["model"] == "m")
    assert m["roles"] == {"starting": 0, "active": 2, "standby": 0, "draining": 0, "warm": 0}
    assert m["ttft_p95_s"] > 0 and m["tpot_p95_s"] > 0  # six streamed replies timed at the door
    # 12 tokens each by their usage reports, over the rate window.
    from hbmserve.deployments.ingress.dashboard_feed import RATE_WINDOW_S
    assert m["tokens_per_s"] == 6 * 12 / RATE_WINDOW_S
    assert m["usd_per_hour"] > 0 and m["queue_depth"] == 0
    assert {r["replica"] for r in snap["placement"]["replicas"]} == {"r0", "r1"}
