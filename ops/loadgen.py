"""`hbmserve bench`'s load generator: what to send and when, through a client of bench_clients.py.

- **Open loop** (`--trace`, `--rate`): each request is sent when its arrival time comes,
  however the server is doing, as users arrive in production. A trace's times are honoured
  (after `--time-scale`); `--rate` draws Poisson (gamma, with `--burstiness`) arrivals. How late
  the client sent its worst request is reported (`send_lag_max_s`), so a client that could not
  keep up is visible rather than hidden in the server's figures.
- **Closed loop** (`--concurrency N`): N users, each sending its next request as soon as its
  last reply ends, until the duration is up; the server's pace sets the arrival rate.

Every request streams, asks for exactly its output length (`ignore_eos`, vLLM's extension,
unless turned off), and is bounded by `timeout_s` (counted as a "timeout" error). Prompts are
random token ids below 256 by default, which any vocabulary accepts and which give the server
exactly the trace's prompt length; `text` prompts are words, about one token each, for
endpoints that take no token ids.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.ops.bench_clients import Ask, Client, Reply
from hbmserve.ops.bench_figures import RequestRecord

PROMPT_FORMATS = ("tokens", "text")
_WORDS = ("time", "model", "cache", "memory", "token", "server", "request", "answer", "value", "story",
          "river", "light", "number", "city", "table", "green")
TOKEN_ID_LOW, TOKEN_ID_HIGH = 10, 256  # ids below 10 are often special (pad, bos, eos, unk)


@dataclass(frozen=True)
class LoadSpec:
    prompt_format: str = "tokens"
    ignore_eos: bool = True
    timeout_s: float = 300.0
    seed: int = 0


def prompt_for(index: int, tokens: int, fmt: str, seed: int = 0) -> list[int] | str:
    """A prompt of `tokens` tokens (ids) or about that many (text); distinct per request from its
    first token, so no two share a prefix-cache block."""
    rng = np.random.default_rng((seed, index))
    if fmt == "tokens":
        return rng.integers(TOKEN_ID_LOW, TOKEN_ID_HIGH, max(1, tokens)).tolist()
    words = rng.choice(len(_WORDS), max(0, tokens - 1))
    return " ".join([f"#{index}", *(_WORDS[w] for w in words)])


def record_of(ask: Ask, reply: Reply, sent_s: float, scheduled_s: float | None = None) -> RequestRecord:
    """A request's record. A reply that asked for its exact length (ignore_eos) and got fewer
    tokens is a "stream" error: the stream broke (vLLM's request function passes over an SSE
    error event) or the server did not honour the length. Tokens are the server's usage count,
    else the streamed chunks."""
    kind, error = reply.error_kind, reply.error
    tokens = reply.usage_tokens if reply.usage_tokens is not None else reply.chunks
    if kind is None and ask.ignore_eos and tokens < ask.max_tokens:
        kind, error = "stream", f"the reply stopped after {tokens} of {ask.max_tokens} tokens"
    if kind is not None:
        return RequestRecord(ask.index, sent_s, ask.prompt_tokens, ask.max_tokens, error_kind=kind, error=error,
                             scheduled_s=scheduled_s)
    return RequestRecord(ask.index, sent_s, ask.prompt_tokens, ask.max_tokens, reply.ttft_s, reply.e2e_s,
                         reply.itl_s, tokens, scheduled_s=scheduled_s)


OnRecord = Callable[[RequestRecord], None]


async def _one(client: Client, ask: Ask, t0: float, spec: LoadSpec, on_record: OnRecord,
               scheduled_s: float | None = None) -> RequestRecord:
    loop = asyncio.get_running_loop()
    sent = loop.time() - t0
    try:
        reply = await asyncio.wait_for(client.send(ask), spec.timeout_s)
    except asyncio.TimeoutError:
        reply = Reply(error_kind="timeout", error=f"no complete reply within {spec.timeout_s:g} s")
    rec = record_of(ask, reply, sent, scheduled_s)
    on_record(rec)
    return rec


def _ask(index: int, prompt: int, output: int, spec: LoadSpec) -> Ask:
    return Ask(index, prompt_for(index, prompt, spec.prompt_format, spec.seed), prompt, output, spec.ignore_eos)


async def open_loop(client: Client, arrivals: Arrivals, spec: LoadSpec,
                    on_record: OnRecord = lambda _: None) -> list[RequestRecord]:
    """Send request i at arrivals.t[i] seconds after the start; wait for every reply."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = []
    for i, (at, p, o) in enumerate(zip(arrivals.t.tolist(), arrivals.prompt.tolist(), arrivals.output.tolist())):
        ask = _ask(i, p, o, spec)  # built before the wait, so the send is on time
        delay = t0 + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_one(client, ask, t0, spec, on_record, at)))
    return list(await asyncio.gather(*tasks))


async def closed_loop(client: Client, concurrency: int, duration_s: float, lengths: Iterator[tuple[int, int]],
                      spec: LoadSpec, on_record: OnRecord = lambda _: None) -> list[RequestRecord]:
    """`concurrency` users send back to back until `duration_s` has passed; in-flight replies
    are awaited. Records in the order sent."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    counter = itertools.count()
    records: list[RequestRecord] = []

    async def user() -> None:
        while loop.time() - t0 < duration_s:
            i = next(counter)
            p, o = next(lengths)
            records.append(await _one(client, _ask(i, p, o, spec), t0, spec, on_record))

    await asyncio.gather(*(user() for _ in range(concurrency)))
    return sorted(records, key=lambda r: r.index)


def arrivals_of(records: list[RequestRecord]) -> Arrivals:
    """The requests as the endpoint saw them, for the simulator: send times (an open loop's
    arrivals as sent, a closed loop's as its users happened to send them), prompt lengths, and
    output lengths as generated (as asked, for a failed request)."""
    order = sorted(records, key=lambda r: (r.sent_s, r.index))
    return Arrivals(np.array([r.sent_s for r in order], dtype=np.float64),
                    np.array([r.prompt_tokens for r in order], dtype=np.int64),
                    np.array([r.output_tokens if r.ok else r.max_tokens for r in order], dtype=np.int64))
