"""The TPOT SLO as a batch cap, and whether a config can meet its SLO at all.

With chunked prefill every decode step may also carry a prefill chunk, and every running
sequence waits for that whole step (Sarathi-Serve's stall-free batching). So the token budget
is not a throughput knob to max out: a step of `max_num_seqs` decodes plus a chunk filling
`max_num_batched_tokens` must fit the TPOT target, or any load that queues a prompt makes the
decodes beside it miss. On a 70B model on H100 TP=4, a step carrying an 8,192-token chunk takes
0.58 s; one carrying 1,024 tokens takes 75 ms. Prefill throughput barely moves (a chunk of 1,024
tokens is already compute-bound), so the cap costs a little TTFT (more, smaller chunks per
prompt) and no capacity.

`batch_cap` derives both knobs from the TPOT target; `slo_check` says whether a config can meet
its SLO at the lightest load per replica its fleet can run (the peak over max_replicas), and
names the blocker with the number to change. Pure arithmetic over the perf model.
"""

from __future__ import annotations

from dataclasses import dataclass

from hbmserve.capacity.perf.perf_model import StepCostModel
from hbmserve.capacity.perf.plan_analytic import EngineKnobs, Workload, estimate

# A decode batch is capped so that a chunk at least this long still fits beside it: a batch that
# fills the whole TPOT budget alone starves prefill, and TTFT grows without bound.
MIN_CHUNK_TOKENS = 256
MAX_SEQS = 1024
ROUND_TOKENS = 64  # budgets are reported rounded down to this (vLLM takes any value)
LIGHT_RPS = 1e-3  # "no load": one request at a time


def chunk_step_s(cost: StepCostModel, budget: int, seqs: int, ctx: float, prompt: float) -> float:
    """A full step under the token budget: `seqs` decodes (context `ctx` each) plus a prefill
    chunk of the rest of the budget, taken as the last chunk of a `prompt`-token prompt (it
    attends over the prompt's earlier tokens too)."""
    dec = max(0, min(seqs, budget))
    chunk = max(0, budget - dec)
    done = max(0.0, prompt - chunk)
    pairs = chunk * done + chunk * (chunk + 1) / 2
    return float(cost.step_time(dec, dec * ctx, chunk, pairs, done + chunk, 1 if chunk else 0))


def budget_for(cost: StepCostModel, tpot_s: float, seqs: int, ctx: float, prompt: float) -> int:
    """Largest token budget whose full step (`seqs` decodes + chunk) fits `tpot_s`; 0 if even
    `seqs` decodes alone do not. The step time grows with the budget, so bisect."""
    if chunk_step_s(cost, seqs, seqs, ctx, prompt) > tpot_s:
        return 0
    lo, hi = seqs, seqs + 1
    while chunk_step_s(cost, hi, seqs, ctx, prompt) <= tpot_s and hi < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if chunk_step_s(cost, mid, seqs, ctx, prompt) <= tpot_s else (lo, mid)
    return lo


@dataclass(frozen=True)
class BatchCap:
    """The engine knobs the TPOT target allows. `max_num_seqs == 0`: none (see `reason`)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    step_s: float  # the full step at these knobs
    reason: str

    @property
    def feasible(self) -> bool:
        return self.max_num_seqs > 0


def batch_cap(cost: StepCostModel, tpot_s: float, w: Workload, kv_tokens: int) -> BatchCap:
    """max_num_seqs: the most decodes that leave room in the TPOT budget for a MIN_CHUNK_TOKENS
    chunk, and no more than the KV cache holds at the workload's mean context;
    max_num_batched_tokens: the largest budget whose full step fits the TPOT target beside them."""
    ctx, prompt = w.prompt_mean + w.output_mean / 2, w.prompt_mean
    kv_seqs = int(min(MAX_SEQS, kv_tokens // max(1.0, ctx)))
    alone = chunk_step_s(cost, 1 + MIN_CHUNK_TOKENS, 1, ctx, prompt)
    if kv_seqs < 1 or alone > tpot_s:
        why = (f"a decode step of one sequence beside a {MIN_CHUNK_TOKENS}-token chunk takes "
               f"{alone:.3f} s > TPOT {tpot_s:g} s" if kv_seqs >= 1 else
               f"the KV cache ({kv_tokens} tokens) holds no sequence of {ctx:.0f} tokens")
        return BatchCap(0, 0, alone, why)
    lo, hi = 1, kv_seqs  # fits(lo) holds; find the largest that fits
    if chunk_step_s(cost, hi + MIN_CHUNK_TOKENS, hi, ctx, prompt) <= tpot_s:
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fits = chunk_step_s(cost, mid + MIN_CHUNK_TOKENS, mid, ctx, prompt) <= tpot_s
        lo, hi = (mid, hi) if fits else (lo, mid)
    seqs = lo
    budget = max(seqs + MIN_CHUNK_TOKENS, _round(budget_for(cost, tpot_s, seqs, ctx, prompt)))
    step = chunk_step_s(cost, budget, seqs, ctx, prompt)
    bound = "KV cache" if seqs == kv_seqs else "TPOT"
    return BatchCap(seqs, budget, step,
                    f"max_num_seqs {seqs} ({bound}-bound), max_num_batched_tokens {budget:,}: a step of "
                    f"{seqs} decodes and a {budget - seqs:,}-token chunk takes {step * 1e3:.0f} ms <= TPOT "
                    f"{tpot_s * 1e3:g} ms")


def knob_grid(cost: StepCostModel, tpot_s: float, w: Workload, kv_tokens: int, seqs_grid: tuple[int, ...],
              budget_grid: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(max_num_seqs, max_num_batched_tokens) pairs to search with chunked prefill: every grid
    value under the TPOT cap plus the cap itself, so the search always holds the largest batch
    the SLO allows and the smaller ones that may buy TTFT or KV headroom. Empty when no batch fits."""
    cap = batch_cap(cost, tpot_s, w, kv_tokens)
    if not cap.feasible:
        return ()
    ctx, prompt, top = w.prompt_mean + w.output_mean / 2, w.prompt_mean, max(budget_grid)
    pairs = []
    for seqs in sorted({s for s in seqs_grid if s < cap.max_num_seqs} | {cap.max_num_seqs}):
        most = min(top, _round(budget_for(cost, tpot_s, seqs, ctx, prompt)))
        pairs += [(seqs, b) for b in sorted({b for b in budget_grid if b <= most} | {most}) if b > seqs]
    return tuple(pairs)


def _round(tokens: int) -> int:
    return tokens - tokens % ROUND_TOKENS if tokens >= ROUND_TOKENS else tokens


@dataclass(frozen=True)
class SloCheck:
    """Can a config meet its SLO at some replica count? Judged at the lightest load per replica
    the fleet can run (`lightest_rps`: the trace's peak over max_replicas; ~0 when the count
    is unbounded), where more replicas can no longer help."""

    feasible: bool
    blocker: str | None  # why not, with the number to change; None when feasible
    advice: str | None  # the chunk-step warning when a full step exceeds TPOT but light load hides it
    lightest_rps: float
    ttft_floor_s: float  # p95s the analytic model expects at `lightest_rps`
    tpot_floor_s: float
    chunk_step_s: float  # a full step at the config's knobs
    budget_for_tpot: int  # the largest max_num_batched_tokens whose full step fits TPOT (0: none)
    tpot_target_s: float = 0.0
    max_num_batched_tokens: int = 0  # the config's
    prompt_mean: float = 0.0  # the request lengths it was judged at (the workload's means)
    output_mean: float = 0.0

    def budget_refusal(self, field: str, lengths: str = "these request lengths") -> str | None:
        """Why the engine budget must change before any fleet is sized, naming `field` (the
        config path of max_num_batched_tokens) and the budget that fits; None when a full step
        fits the TPOT target. No replica count rescues a step that breaks it: every step that
        carries a full chunk stalls every decode in the batch that long. `lengths` says what the
        step was judged at (a trace's lengths, or the nominal request a check without one uses)."""
        if self.chunk_step_s <= self.tpot_target_s:
            return None
        fix = (f"set it to <= {self.budget_for_tpot:,}" if self.budget_for_tpot
               else "even the decodes alone exceed it: lower max_num_seqs")
        return (f"{field}: a decode step carrying a full {self.max_num_batched_tokens:,}-token chunk takes "
                f"{self.chunk_step_s:.2f} s > the TPOT target {self.tpot_target_s:g} s at {lengths}, "
                f"whatever the replica count: {fix} (or pass --allow-slo-miss to run anyway)")

    def to_json_dict(self) -> dict[str, object]:
        return {"slo_feasible": self.feasible, "slo_blocker": self.blocker, "slo_advice": self.advice,
                "tpot_floor_s": self.tpot_floor_s, "chunk_step_s": self.chunk_step_s,
                "max_num_batched_tokens_for_tpot": self.budget_for_tpot}


def slo_check(cost: StepCostModel, k: EngineKnobs, w: Workload, slo_ttft_s: float, slo_tpot_s: float,
              lightest_rps: float = LIGHT_RPS) -> SloCheck:
    ctx, prompt = w.prompt_mean + w.output_mean / 2, w.prompt_mean
    seqs = min(k.max_num_seqs, k.max_num_batched_tokens)
    step = chunk_step_s(cost, k.max_num_batched_tokens, seqs if k.chunked_prefill else 0, ctx, prompt)
    cap = budget_for(cost, slo_tpot_s, seqs, ctx, prompt) if k.chunked_prefill else 0
    cap = _round(cap) if cap > seqs + ROUND_TOKENS else cap
    rate = max(lightest_rps, LIGHT_RPS)
    e = estimate(cost, k, w, rate)
    if cap:
        fix = f"lower max_num_batched_tokens to <= {cap:,}"
    elif k.chunked_prefill:
        fix = f"{seqs} decodes alone exceed it: lower max_num_seqs"
    else:
        fix = "enable chunked prefill"
    chunk_msg = (f"decode steps carrying {'a chunk' if k.chunked_prefill else 'a prefill'} of "
                 f"{k.max_num_batched_tokens:,} tokens take {step:.2f} s > TPOT {slo_tpot_s:g} s: {fix}")
    bounded = rate > LIGHT_RPS
    where = f"at {rate:.2f} req/s per replica" + (" (the peak over max_replicas)" if bounded
                                                  else " (one request at a time)")
    problems = []
    if e.overloaded:
        problems.append(f"one replica is overloaded {where} ({e.reason})" + (": raise max_replicas" if bounded else ""))
    if e.tpot_p95_s > slo_tpot_s:
        problems.append(f"{chunk_msg} (p95 TPOT {e.tpot_p95_s:.3f} s even {where})" if step > slo_tpot_s else
                        f"p95 TPOT {e.tpot_p95_s:.3f} s > {slo_tpot_s:g} s even {where}")
    if e.ttft_p95_s > slo_ttft_s and not e.overloaded:
        problems.append(f"p95 TTFT {e.ttft_p95_s:.2f} s > {slo_ttft_s:g} s even {where} (a "
                        f"{w.prompt_p95:.0f}-token prompt's prefill)")
    advice = None if problems or step <= slo_tpot_s else (
        f"{chunk_msg}; the SLO then holds only while few steps carry a full chunk (light load per replica)")
    return SloCheck(not problems, "; ".join(problems) or None, advice, rate, e.ttft_p95_s, e.tpot_p95_s,
                    step, cap, slo_tpot_s, k.max_num_batched_tokens, w.prompt_mean, w.output_mean)
