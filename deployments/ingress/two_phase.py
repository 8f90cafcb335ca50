"""A disaggregated model's request in two phases (issue 23), as vLLM's KV connectors expect.

    decode = choose_decode(decode pool)        # a decode replica with room for the KV, or none
    for replica in choose(prefill pool):       # prefix affinity and load; a failure tries the next
        params = prefill(replica)              # the prompt alone: max_tokens 1, not streamed, KV kept
    -> Phase("decode", body + kv_transfer_params)  # the door relays it as any request (front_door_app.py)
    -> Phase(None, body)                       # or aggregated on any replica of either pool

The decode replica loads the prompt's KV through its connector and computes only the last
prompt token; the client sees only its reply, one ordinary response or stream. Whatever cannot
run in two phases runs aggregated rather than fails: no prefill replica answered, or no decode
replica has room for the KV. A decode replica lost before its first byte is retried on another
with the same hand-off (front_door_app.py), then aggregated.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass, replace

from hbmserve.core.routing import RouteRequest, Router
from hbmserve.deployments.ingress.relay import NotStarted
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from hbmserve.routing.choose import choose_decode

log = logging.getLogger("hbmserve.frontdoor")

PREFILL, DECODE = "prefill", "decode"
# Paths run in two phases; the others (embeddings, tokenize) run aggregated on any replica.
TWO_PHASE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
PREFILL_TRIES = 2  # prefill replicas tried before the request runs aggregated
# Asks the prefill replica to keep the prompt's KV for a decode replica (vLLM's connector API).
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


class PrefillFailed(NotStarted):
    """The prefill replica failed or refused: the prefill is tried elsewhere, or runs aggregated."""


@dataclass(frozen=True)
class Phase:
    """What the door relays as the client's reply: to which pool (None: any replica, the whole
    request there), the body, the request as the router sees it, and why."""

    role: str | None
    raw: bytes
    route: RouteRequest
    why: str


def prefill_body(body: dict) -> bytes:
    """The request a prefill replica runs: the client's, one token, no stream, KV kept."""
    return json.dumps({**body, "max_tokens": 1, "max_completion_tokens": None, "stream": False,
                       "stream_options": None, "n": 1, "kv_transfer_params": PREFILL_PARAMS}).encode()


def with_handoff(raw: bytes, params: dict | None) -> bytes:
    """The client's request for the decode replica, with the prefill's hand-off (None: the
    connector finds the KV by the prompt itself, as vLLM's shared-storage connector does)."""
    return raw if not params else json.dumps({**json.loads(raw), "kv_transfer_params": params}).encode()


async def prefill(session, url: str, headers: dict[str, str], body: dict, timeout_s: float) -> dict | None:
    """Run the prompt on the prefill replica at `url`; the `kv_transfer_params` its reply names.
    Raises PrefillFailed when it fails or answers anything but 200."""
    import aiohttp

    try:
        async with session.post(url, data=prefill_body(body), headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise PrefillFailed(f"prefill answered {resp.status}: {raw[:200]!r}")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
        raise PrefillFailed(f"prefill failed: {type(err).__name__} {err}") from None
    try:
        params = json.loads(raw).get("kv_transfer_params")
    except (ValueError, AttributeError):
        raise PrefillFailed("prefill's reply is not a JSON object") from None
    return params if isinstance(params, dict) else None


class TwoPhase:
    """The prefill phase of every disaggregated model at one door, and its counts by outcome
    (door_metrics.py exports them as hbmserve_disagg_requests_total)."""

    def __init__(self, table: ReplicaTable, router: Router, session_of):
        self.table = table
        self.router = router
        self.session_of = session_of
        self.outcomes: dict[str, Counter] = {}  # model -> outcome -> requests

    def _count(self, model: str, outcome: str) -> None:
        self.outcomes.setdefault(model, Counter())[outcome] += 1

    async def run(self, model: str, path: str, headers: dict[str, str], body: dict, raw: bytes,
                  route: RouteRequest, precise: bool, timeout_s: float) -> Phase:
        """Prefill the request and say where its reply runs (see the module's docstring)."""
        decode = choose_decode(self.router, self.table.loads(model, role=DECODE), route)
        if not decode.ranked:
            self._count(model, "aggregated_no_decode")
            return Phase(None, raw, route, f"aggregated: {decode.reason}")
        ranked = self.router(self.table.loads(model, precise, role=PREFILL), route).ranked
        for rid in ranked[:PREFILL_TRIES]:
            replica = self.table.get(model, rid)
            replica.sent_since_poll += 1
            if not precise:
                replica.remember(route.prefix_hashes)
            try:
                params = await prefill(self.session_of(), replica.endpoint.url + path, headers, body, timeout_s)
            except PrefillFailed as err:
                log.warning("%s: prefill on %s failed (%s)", model, rid, err)
                self.table.mark_unreachable(model, rid)
                self._count(model, "prefill_failed")
                continue
            self._count(model, "two_phase")
            return Phase(DECODE, with_handoff(raw, params), replace(route, prefix_hashes=()), f"prefilled on {rid}")
        self._count(model, "aggregated_no_prefill")
        return Phase(None, raw, route, "aggregated: no prefill replica answered" if ranked
                     else "aggregated: no active prefill replica")

    def aggregated(self, model: str, raw: bytes, route: RouteRequest, why: str) -> Phase:
        """The fall-back after every decode replica failed before its first byte."""
        self._count(model, "aggregated_decode_failed")
        return Phase(None, raw, route, f"aggregated: {why}")
