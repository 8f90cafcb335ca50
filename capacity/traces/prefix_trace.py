"""A prefix-heavy synthetic trace: shared system prompts and multi-turn chat sessions.

What makes a router's prefix affinity matter, and nothing else:
  - `system_prompts` system prompts of a few thousand tokens, chosen per session with Zipf
    popularity (rank k has weight 1 / k**zipf_s): every session of a prompt shares its blocks;
  - sessions start as a Poisson process; a session has a geometric number of turns (mean
    `mean_turns`), `think_s` (exponential mean) apart, measured arrival to arrival, so it
    includes the reply time (the trace is open loop: it cannot know when a reply ends);
  - turn t's prompt is the system prompt, then the whole conversation so far (every earlier
    user message and reply), then the new user message: it extends turn t-1's prompt plus
    reply, so a replica that served turn t-1 holds all but the last two messages in cache;
  - a session ends early when its next turn would not fit `max_context_tokens`.

Block hash ids (`Arrivals.hashes`) name full blocks of `block_tokens` tokens, chained in effect:
a block lying wholly inside the system prompt is named by (prompt, block index), any later block
by (session, block index), since all of a session's turns share one growing token stream. So two
requests share hash i exactly when their first i+1 blocks are the same tokens. Run the engine
with `hash_block_tokens = block_tokens`.

Pure and seeded: the same spec and seed give the same arrivals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.traces.arrivals import Arrivals, TraceError

_IDS_PER_STREAM = 1 << 20  # block indices per prompt or session; a prompt is far shorter


@dataclass(frozen=True)
class PrefixTraceSpec:
    duration_s: float = 600.0
    session_rps: float = 0.5  # session starts per second
    system_prompts: int = 8
    system_prompt_tokens: float = 2500.0  # mean; log-normal, cv 0.4
    zipf_s: float = 1.0
    mean_turns: float = 4.0
    think_s: float = 30.0
    user_tokens: float = 120.0  # mean per user message; log-normal, cv 0.8
    output_tokens: float = 250.0  # mean per reply; log-normal, cv 0.8
    max_context_tokens: int = 8192
    block_tokens: int = 16

    def __post_init__(self) -> None:
        problems = [f"{n} must be > 0" for n in ("duration_s", "session_rps", "system_prompt_tokens",
                                                  "think_s", "user_tokens", "output_tokens")
                    if not getattr(self, n) > 0]
        if self.system_prompts < 1:
            problems.append("system_prompts must be >= 1")
        if self.mean_turns < 1:
            problems.append("mean_turns must be >= 1")
        if self.zipf_s < 0:
            problems.append("zipf_s must be >= 0")
        if self.block_tokens < 1 or self.max_context_tokens < 2 * self.block_tokens:
            problems.append("block_tokens must be >= 1 and max_context_tokens >= 2 blocks")
        if problems:
            raise TraceError("prefix trace: " + "; ".join(problems))


def _lognormal(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    sigma2 = np.log1p(cv * cv)
    return np.maximum(1, np.rint(rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), n))).astype(np.int64)


def _block_ids(prompt_tokens: int, system_tokens: int, system_id: int, session_id: int, block: int) -> tuple[int, ...]:
    n = prompt_tokens // block
    in_system = min(n, system_tokens // block)
    return (tuple(system_id * _IDS_PER_STREAM + i for i in range(in_system))
            + tuple(session_id * _IDS_PER_STREAM + i for i in range(in_system, n)))


def prefix_arrivals(spec: PrefixTraceSpec = PrefixTraceSpec(), seed: int = 0) -> Arrivals:
    rng = np.random.default_rng(seed)
    k = spec.system_prompts
    sys_tokens = np.minimum(_lognormal(rng, spec.system_prompt_tokens, 0.4, k), spec.max_context_tokens // 2)
    weights = 1.0 / np.arange(1, k + 1) ** spec.zipf_s
    n_sessions = rng.poisson(spec.session_rps * spec.duration_s)
    starts = np.sort(rng.uniform(0.0, spec.duration_s, n_sessions))  # Poisson, given the count
    prompts_of = rng.choice(k, n_sessions, p=weights / weights.sum())
    turns_of = rng.geometric(1.0 / spec.mean_turns, n_sessions)
    t: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    hashes: list[tuple[int, ...]] = []
    for s in range(n_sessions):
        n = int(turns_of[s])
        when = starts[s] + np.concatenate([[0.0], np.cumsum(rng.exponential(spec.think_s, n - 1))])
        users, replies = _lognormal(rng, spec.user_tokens, 0.8, n), _lognormal(rng, spec.output_tokens, 0.8, n)
        system = int(sys_tokens[prompts_of[s]])
        context = system
        for turn in range(n):
            p = context + int(users[turn])
            o = int(replies[turn])
            if when[turn] >= spec.duration_s or p + o > spec.max_context_tokens:
                break
            t.append(float(when[turn]))
            prompt.append(p)
            output.append(o)
            # Stream ids: 1..k for system prompts, k+1.. for sessions; 0 is never used.
            hashes.append(_block_ids(p, system, 1 + int(prompts_of[s]), 1 + k + s, spec.block_tokens))
            context = p + o
    if not t:
        raise TraceError("prefix trace: no requests (raise duration_s or session_rps)")
    order = np.argsort(np.asarray(t), kind="stable")
    return Arrivals(np.asarray(t)[order], np.asarray(prompt, dtype=np.int64)[order],
                    np.asarray(output, dtype=np.int64)[order], tuple(hashes[i] for i in order))


BLOCK_TOKENS = 512  # hash blocks of the named shapes (Mooncake's size)

# Named shapes of prefix-heavy traffic, each one job's (ops/bench/kv_routing.py measures routers on
# them; `hbmserve prefix-trace` writes them as JSONL with hash_ids):
# - system prompts: 512 long shared system prompts (Zipf), single questions;
# - multi-turn: chat sessions of ~6 turns 150 s apart whose prompts carry the whole history;
# - agent loops: ~20 quick steps a session, each adding a tool result to a growing context.
PREFIX_SHAPES: dict[str, PrefixTraceSpec] = {
    "system-prompts": PrefixTraceSpec(duration_s=1200, session_rps=6.0, system_prompts=512, system_prompt_tokens=6000,
                                      zipf_s=0.8, mean_turns=1, user_tokens=400, output_tokens=200,
                                      max_context_tokens=32768, block_tokens=BLOCK_TOKENS),
    "multi-turn": PrefixTraceSpec(duration_s=1200, session_rps=1.2, system_prompts=16, system_prompt_tokens=1500,
                                  mean_turns=6, think_s=150, user_tokens=2000, output_tokens=400,
                                  max_context_tokens=32768, block_tokens=BLOCK_TOKENS),
    "agent-loops": PrefixTraceSpec(duration_s=1200, session_rps=0.6, system_prompts=4, system_prompt_tokens=4000,
                                   mean_turns=20, think_s=20, user_tokens=800, output_tokens=150,
                                   max_context_tokens=32768, block_tokens=BLOCK_TOKENS),
}
