"""The analytic performance model: how long one engine step takes, and how much KV fits.

A step's time is a roofline per pipeline stage,
    max(FLOPs / (TP * peak * eff_flops), bytes / (TP * HBM_bw * eff_bw))
plus two ring all-reduces per layer across the TP group (alpha + 2(n-1)/n * S/B), the PP stage
hand-offs, and fixed CPU overheads (per step and per sequence). With PP the batch splits into
min(PP, sequences) micro-batches that stream through the stages; when there are fewer sequences
than stages, stages idle (the bubble). Chunked prefill is just prefill tokens in the same step as
decode tokens: both enter the FLOP and byte counts.

Everything here is pure arithmetic over frozen inputs; `step_time` accepts a numpy array for the
decode context so a run of identical decode steps is costed in one vectorised call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.perf.hardware import GpuProfile, Link
from hbmserve.capacity.perf.model_shape import ModelShape, weight_format


@dataclass(frozen=True)
class Deployment:
    """One replica: a model on TP x PP GPUs of one type, in one weight format."""

    model: ModelShape
    gpu: GpuProfile
    tp: int = 1
    pp: int = 1
    quantization: str | None = None
    gpu_memory_utilization: float = 0.9
    nvlink: bool = True  # False puts the TP ring on the host PCIe path (an "off-NVLink" group)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class MemoryFit:
    fits: bool
    weights_per_rank_bytes: float
    kv_bytes_per_rank: float
    kv_tokens: int
    reason: str


def allreduce_time(n: int, message_bytes: float, link: Link) -> float:
    """Ring all-reduce of `message_bytes` over `n` ranks: alpha + 2(n-1)/n * S / B."""
    if n <= 1:
        return 0.0
    return link.latency_s + 2.0 * (n - 1) / n * message_bytes / link.collective_bw_bytes_s


def tp_link(gpu: GpuProfile, tp: int, nvlink: bool = True) -> Link:
    if tp > gpu.gpus_per_node:
        return gpu.inter_node
    return gpu.intra_node if nvlink else gpu.host_link


def pp_link(gpu: GpuProfile, tp: int, pp: int) -> Link:
    return gpu.intra_node if tp * pp <= gpu.gpus_per_node else gpu.inter_node


def pp_bubble_fraction(pp: int, num_sequences: int) -> float:
    """Fraction of stage-time idle when fewer micro-batches than stages are in flight."""
    if pp <= 1:
        return 0.0
    m = max(1, min(pp, num_sequences))
    return 1.0 - m / pp


def memory_fit(dep: Deployment) -> MemoryFit:
    """KV capacity = (HBM * util - weights/(TP*PP) - reserve) / KV bytes per token per rank."""
    m, g = dep.model, dep.gpu
    weights = m.weight_bytes(dep.quantization) / dep.num_gpus
    per_tok = m.kv_bytes_per_token_per_rank(dep.tp, dep.pp)
    budget = g.hbm_bytes * dep.gpu_memory_utilization
    if weights > budget:
        return MemoryFit(False, weights, 0.0, 0,
                         f"weights need {weights / 1e9:.1f} GB per GPU but {g.name} has "
                         f"{budget / 1e9:.1f} GB at utilisation {dep.gpu_memory_utilization:g}")
    if g.kv_cache_bytes is not None:
        kv = g.kv_cache_bytes
    else:
        kv = budget - weights - g.reserve_bytes
    if kv <= 0:
        return MemoryFit(False, weights, 0.0, 0,
                         f"weights ({weights / 1e9:.1f} GB) plus reserve ({g.reserve_bytes / 1e9:.1f} GB) "
                         f"leave no KV space on {g.name}")
    tokens = int(kv // per_tok)
    return MemoryFit(True, weights, kv, tokens,
                     f"{weights / 1e9:.1f} GB weights and {kv / 1e9:.1f} GB KV per GPU ({tokens} tokens)")


@dataclass(frozen=True)
class StepCostModel:
    """Precomputed coefficients of one deployment's step time (build with `cost_model`)."""

    dep: Deployment
    flops_per_token: float  # decoder linears, 2 * active params
    flops_per_logit: float  # LM head, 2 * vocab * hidden
    flops_per_attn_pair: float  # 4 * layers * heads * head_dim per (query, key) pair
    dense_read_bytes: float  # weights every step reads in full
    expert_bytes: float  # MoE expert weights, read as far as tokens route to them
    expert_hit: float  # k / E: chance one token routes to a given expert
    kv_bytes_per_token: float
    act_bytes_per_token: float  # hidden * dtype: one all-reduce / hand-off message per token
    peak_flops: float  # per GPU, in the deployment's weight format
    eff_flops: float
    eff_bw: float
    layers_per_stage: int
    tp_link: Link
    pp_link: Link

    def step_time(self, n_dec: int, ctx_dec, n_pre: int = 0, pre_pairs: float = 0.0,
                  pre_kv: float = 0.0, n_chunks: int = 0):
        """Seconds for one engine step.

        n_dec: decode sequences (one token each); ctx_dec: sum of their context lengths (scalar or
        array); n_pre: prefill tokens; pre_pairs: attention (query, key) pairs of those tokens;
        pre_kv: KV tokens the prefill chunks read (their earlier context plus themselves);
        n_chunks: prefill chunks in the step.
        """
        d, g = self.dep, self.dep.gpu
        seqs = n_dec + n_chunks
        if seqs == 0:
            return g.overheads.step_s
        m = min(d.pp, seqs)
        tokens = (n_dec + n_pre) / m
        flops = (self.flops_per_token * tokens + self.flops_per_logit * seqs / m
                 + self.flops_per_attn_pair * (ctx_dec + pre_pairs) / m) / d.pp
        weights = self.dense_read_bytes
        if self.expert_bytes:
            weights = weights + self.expert_bytes * (1.0 - (1.0 - self.expert_hit) ** tokens)
        nbytes = (weights + self.kv_bytes_per_token * ((ctx_dec + pre_kv) / m + tokens)) / d.pp
        compute = flops / (d.tp * self.peak_flops * self.eff_flops)
        memory = nbytes / (d.tp * g.hbm_bw_bytes_s * self.eff_bw)
        msg = tokens * self.act_bytes_per_token
        comm = 2 * self.layers_per_stage * allreduce_time(d.tp, msg, self.tp_link)
        stage = np.maximum(compute, memory) + comm
        handoff = (d.pp - 1) * (self.pp_link.latency_s + msg / self.pp_link.bw_bytes_s) if d.pp > 1 else 0.0
        return g.overheads.step_s + g.overheads.per_seq_s * seqs + d.pp * stage + handoff

    def decode_step_times(self, n: int, ctx0: float, k: int) -> np.ndarray:
        """Times of k consecutive decode-only steps of n sequences starting at context sum ctx0."""
        ctx = ctx0 + n * np.arange(k, dtype=np.float64)
        return np.asarray(self.step_time(n, ctx), dtype=np.float64) * np.ones(k)

    def min_step_time(self) -> float:
        """A lower bound on any non-empty step: one token, no context (property tests use it)."""
        return float(self.step_time(1, 0.0))

    def roofline_tokens_per_s(self) -> float:
        """Upper bound on tokens processed per second: all GPUs at peak FLOP/s on linears only."""
        return self.dep.num_gpus * self.peak_flops / self.flops_per_token

    def swap_time(self, tokens: int) -> float:
        """Copy one sequence's KV across the host link (each way costs this)."""
        per_rank = self.dep.model.kv_bytes_per_token_per_rank(self.dep.tp, self.dep.pp)
        link = self.dep.gpu.host_link
        return link.latency_s + tokens * per_rank / link.bw_bytes_s

    def host_block_value(self, tokens: int) -> float:
        """The share of computing `tokens` of prefill (in a long batched prefill, 4,096 tokens a
        step) that loading their KV from a host tier over PCIe saves; 0 when loading is slower."""
        per_rank = self.dep.model.kv_bytes_per_token_per_rank(self.dep.tp, self.dep.pp)
        load = tokens * per_rank / self.dep.gpu.host_link.bw_bytes_s
        compute = self.prefill_time(4096, 4096) * tokens / 4096
        return max(0.0, 1.0 - load / compute) if compute > 0 else 0.0

    def prefill_tokens_per_s(self, prompt: float, budget: int) -> float:
        """Prompt tokens per second one replica computes doing nothing but prefill (a
        disaggregated prefill pool), at prompts of `prompt` tokens under a token budget: short
        prompts packed whole into full-budget steps, a long one chunk by chunk."""
        p = max(1, int(prompt))
        if p >= budget:
            return p / self.prefill_time(p, budget)
        k = budget // p
        n = k * p
        return n / float(self.step_time(0, 0.0, n, k * p * (p + 1) / 2, n, k))

    def prefill_time(self, prompt: int, budget: int) -> float:
        """One sequence's prefill alone, chunked by the token budget."""
        total, done = 0.0, 0
        while done < prompt:
            c = min(budget, prompt - done)
            pairs = c * done + c * (c + 1) / 2
            total += float(self.step_time(0, 0.0, c, pairs, done + c, 1))
            done += c
        return total


def cost_model(dep: Deployment) -> StepCostModel:
    m, g = dep.model, dep.gpu
    fmt = weight_format(dep.quantization, m.dtype_bytes)
    weight_bytes = m.weight_bytes(dep.quantization)
    # The input embedding is a row lookup; only a tied table is read in full (as the LM head).
    embed_lookup = 0.0 if m.tie_embeddings else m.vocab * m.hidden * m.dtype_bytes
    experts = m.expert_weight_bytes(dep.quantization)
    compute_quant = fmt if fmt in ("fp8", "int8") else None
    return StepCostModel(
        dep=dep,
        flops_per_token=2.0 * m.num_layers * m.active_linear_params_per_layer,
        flops_per_logit=2.0 * m.vocab * m.hidden,
        flops_per_attn_pair=4.0 * m.num_layers * m.num_heads * m.head_dim,
        dense_read_bytes=weight_bytes - embed_lookup - experts,
        expert_bytes=experts,
        expert_hit=min(1.0, m.experts_per_token / m.num_experts) if m.num_experts > 1 else 0.0,
        kv_bytes_per_token=m.kv_bytes_per_token,
        act_bytes_per_token=m.hidden * m.dtype_bytes,
        peak_flops=g.flops_for(compute_quant),
        eff_flops=g.efficiency.flops,
        eff_bw=g.efficiency.hbm_bw,
        layers_per_stage=math.ceil(m.num_layers / dep.pp),
        tp_link=tp_link(g, dep.tp, dep.nvlink),
        pp_link=pp_link(g, dep.tp, dep.pp),
    )


# The paths a prompt's KV can take from a prefill replica to a decode replica (issue 23): NVLink
# within a node, the inter-node fabric (InfiniBand), or through host memory (the CPU connector,
# and any GPU pair without a direct path: device -> host -> device, two PCIe copies).
KV_LINKS = ("nvlink", "infiniband", "host")


def kv_transfer_s(prefill: Deployment, decode: Deployment, tokens: int, link: str) -> float:
    """Seconds to move `tokens` of KV from a prefill replica to a decode replica over `link`:
    layers x KV heads x head dim x tokens x dtype bytes (x2, K and V), sent by the TP ranks in
    parallel pairs (min of the two pools' TP), one NIC or link each, from the hardware catalog."""
    if link not in KV_LINKS:
        raise ValueError(f"link must be one of {', '.join(KV_LINKS)}, not {link!r}")
    gpu = prefill.gpu
    path = {"nvlink": gpu.intra_node, "infiniband": gpu.inter_node, "host": gpu.host_link}[link]
    copies = 2 if link == "host" else 1
    lanes = min(prefill.tp * prefill.pp, decode.tp * decode.pp)
    size = tokens * prefill.model.kv_bytes_per_token
    return copies * (path.latency_s + size / (path.bw_bytes_s * lanes))
