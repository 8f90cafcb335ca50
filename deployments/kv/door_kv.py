"""A front door's picture of what each model's engines hold, from their own KV events: one KV
index per model (routing/kv_index.py), kept by one subscriber per replica that publishes
(kv_subscriber.py), and the model's tokenizer, to hash a prompt as the engines do
(prompt_tokens.py, routing/engine_hashes.py).

Every door keeps its own (one stream per replica per door): a door then needs nothing but the
replicas' ports, and the index is never shared state that could lag behind one door's view.
For vLLM engines (HASHING_VLLM) the tokenizer is fetched from a replica of the model once
(`GET /hbm/tokenizer`); until it has loaded, or for a request it cannot render exactly, `hashes`
returns None and the door routes that request on its approximate text hashes (routing/prefix.py).
Simulated engines (HASHING_TEXT) hash the prompt's text, which the door hashes the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hbmserve.core.kv_events import ReplicaKv
from hbmserve.core.records import HASHING_TEXT, HASHING_VLLM, KvEventsInfo, ReplicaEndpoint
from hbmserve.core.door_records import KvRouting
from hbmserve.deployments.kv.kv_stream import TOKENIZER_PATH
from hbmserve.deployments.kv.kv_subscriber import KvSubscriber
from hbmserve.deployments.kv.prompt_tokens import PromptTokenizer, TokenizerUnavailable
from hbmserve.routing.engine_hashes import engine_block_hashes
from hbmserve.routing.kv_index import IndexLimits, IndexStats, KvIndex
from hbmserve.routing.prefix import prompt_block_hashes, request_text

log = logging.getLogger("hbmserve.frontdoor")

TOKENIZER_TIMEOUT_S = 30.0
TOKENIZER_RETRY_S = 10.0


@dataclass(frozen=True)
class KvDoorStats:
    """One model's KV routing at one door, for /metrics (door_metrics.py)."""

    index: IndexStats
    streams: int  # event streams connected now
    unreadable: int  # batches that did not decode, dropped
    hashed: int  # requests hashed as the engines hash them
    hash_s: float  # the door's time tokenizing and hashing them
    tokenizer: str  # "loaded", or why not


def kv_routing(k: KvDoorStats) -> KvRouting:
    i = k.index
    return KvRouting(streams=k.streams, hbm_blocks=i.hbm_hashes, host_blocks=i.host_hashes, untrusted=len(i.distrusted),
                     max_lag_s=i.max_lag_s, batches=i.batches, lost=k.unreadable + i.resets, hashed=k.hashed,
                     hash_ms=1000 * k.hash_s / k.hashed if k.hashed else 0.0)


@dataclass
class ModelKv:
    index: KvIndex
    info: KvEventsInfo | None = None  # how its engines name blocks (the newest replica's)
    tokenizer: PromptTokenizer | None = None
    tokenizer_note: str = "not loaded yet"
    tokenizer_tried_at: float = float("-inf")
    subscribers: dict[str, tuple[KvSubscriber, asyncio.Task]] = field(default_factory=dict)
    hashed: int = 0  # requests hashed as the engines hash them
    hash_s: float = 0.0  # the door's time spent tokenizing and hashing them
    unreadable_gone: int = 0  # unreadable batches of streams since ended (a counter never goes down)


class DoorKv:
    def __init__(self, headers: dict[str, str], session_of: Callable[[], Any],
                 limits: IndexLimits = IndexLimits(), clock: Callable[[], float] = time.time) -> None:
        self.headers, self.session_of, self.limits, self.clock = headers, session_of, limits, clock
        self.models: dict[str, ModelKv] = {}

    # ---- which replicas publish (the door's discovery loop) ----
    def sync(self, model: str, endpoints: Iterable[ReplicaEndpoint]) -> None:
        """Follow the model's publishing replicas: a stream for each new one, the end of a
        departed one's (forgotten at once)."""
        publishing = {ep.replica: ep for ep in endpoints if ep.kv_events is not None}
        m = self.models.setdefault(model, ModelKv(KvIndex(self.limits)))
        for rid in list(m.subscribers):
            ep = publishing.get(rid)
            if ep is None or ep.url != m.subscribers[rid][0].url:
                sub, task = m.subscribers.pop(rid)
                task.cancel()
                m.unreadable_gone += sub.dropped
                m.index.forget(rid)
        loop = asyncio.get_running_loop()
        for rid, ep in publishing.items():
            if rid not in m.subscribers:
                sub = KvSubscriber(rid, ep.url, self.headers, m.index, self.session_of, self.clock)
                m.subscribers[rid] = (sub, loop.create_task(sub.run()))
        if publishing:
            m.info = max(publishing.values(), key=lambda ep: ep.at).kv_events
            if m.info.hashing == HASHING_TEXT:
                m.tokenizer_note = "not needed: the engines hash the prompt's text"
            elif m.tokenizer is None and self.clock() - m.tokenizer_tried_at >= TOKENIZER_RETRY_S:
                m.tokenizer_tried_at = self.clock()
                loop.create_task(self._load_tokenizer(model, next(iter(publishing.values())).url))

    async def _load_tokenizer(self, model: str, url: str) -> None:
        import aiohttp

        m = self.models[model]
        try:
            async with self.session_of().get(url + TOKENIZER_PATH, headers=self.headers,
                                             timeout=aiohttp.ClientTimeout(total=TOKENIZER_TIMEOUT_S)) as resp:
                body = await resp.read()
            if resp.status != 200:
                m.tokenizer_note = f"the replica has none: {json.loads(body).get('error', resp.status)}"
                return
            m.tokenizer = await asyncio.to_thread(PromptTokenizer, json.loads(body))
            m.tokenizer_note = "loaded"
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, TokenizerUnavailable) as err:
            m.tokenizer_note = f"could not load: {err or type(err).__name__}"
        if m.tokenizer is None:
            log.warning("%s: no tokenizer at the door (%s); routing on approximate prefixes", model, m.tokenizer_note)

    async def close(self) -> None:
        tasks = [t for m in self.models.values() for _, t in m.subscribers.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for m in self.models.values():
            m.subscribers.clear()

    # ---- per request ----
    def hashes(self, model: str, path: str, body: Mapping[str, Any]) -> tuple[int, ...] | None:
        """The prompt's block hashes as the model's engines compute them, or None: the model's
        engines publish nothing, its tokenizer is not loaded, or the request is one the door
        cannot hash exactly (several prompts, message parts, tools)."""
        m = self.models.get(model)
        if m is None or m.info is None:
            return None
        started = time.perf_counter()
        if m.info.hashing == HASHING_TEXT:
            text = request_text(path, body)  # as the simulated engine takes it (sim_server.prefix_hashes)
            out = None if text is None else prompt_block_hashes(text)
        elif m.info.hashing == HASHING_VLLM and m.tokenizer is not None:
            ids = self._token_ids(m.tokenizer, path, body)
            out = None if ids is None else engine_block_hashes(ids, m.info.block_size)
        else:
            return None
        if out is not None:
            m.hashed += 1
            m.hash_s += time.perf_counter() - started
        return out

    @staticmethod
    def _token_ids(tok: PromptTokenizer, path: str, body: Mapping[str, Any]) -> list[int] | None:
        if path == "/v1/chat/completions":
            messages = body.get("messages")
            return tok.chat(messages) if isinstance(messages, list) else None
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            return tok.completion(prompt)
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return prompt  # token ids go to the engine as they are
        return None

    def view(self, model: str, replica_id: str) -> ReplicaKv:
        m = self.models.get(model)
        if m is None:
            return ReplicaKv(trusted=False, why="no KV events for this model")
        return m.index.view(replica_id)

    def stats(self, model: str) -> IndexStats | None:
        m = self.models.get(model)
        return m.index.stats() if m is not None and m.subscribers else None

    def reports(self) -> dict[str, KvDoorStats]:
        """Each model whose engines publish KV events."""
        return {name: KvDoorStats(m.index.stats(), sum(s.connected for s, _ in m.subscribers.values()),
                                  m.unreadable_gone + sum(s.dropped for s, _ in m.subscribers.values()),
                                  m.hashed, m.hash_s,
                                  m.tokenizer_note)
                for name, m in sorted(self.models.items()) if m.subscribers}
