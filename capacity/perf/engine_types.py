"""The value types the scheduler works on: engine settings, a request's progress, a step plan."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.perf.kv_blocks import blocks_for
from hbmserve.capacity.perf.lora import LoraCost


class EngineConfigError(ValueError):
    """Engine settings that cannot run (the message names the setting)."""


@dataclass(frozen=True)
class EngineConfig:
    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    preemption_mode: str = "recompute"  # or "swap"
    swap_space_tokens: int = 0
    hash_block_tokens: int = 512
    max_coalesced_steps: int = 1024
    # A host-memory KV tier behind the prefix cache (vLLM's CPU offloading), in tokens; 0: none.
    host_kv_tokens: int = 0
    # Record KV events (core/kv_events.py) for a KV index, as vLLM's --kv-events-config does.
    publish_kv_events: bool = False
    # LoRA enabled: its slots, load times and per-step cost (lora.py); None: no adapters.
    lora: LoraCost | None = None

    def __post_init__(self) -> None:
        if self.num_blocks * self.block_size < self.max_model_len:
            raise EngineConfigError(
                f"max_model_len {self.max_model_len} needs {blocks_for(self.max_model_len, self.block_size)} "
                f"KV blocks but only {self.num_blocks} fit")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise EngineConfigError("max_num_batched_tokens must be >= max_model_len without chunked prefill")
        if self.preemption_mode not in ("recompute", "swap"):
            raise EngineConfigError(f"preemption_mode must be recompute or swap, not {self.preemption_mode!r}")
        if self.host_kv_tokens < 0 or (self.host_kv_tokens and not self.enable_prefix_caching):
            raise EngineConfigError("host_kv_tokens must be >= 0, and needs enable_prefix_caching")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_coalesced_steps < 1:
            raise EngineConfigError("max_num_seqs, max_num_batched_tokens and max_coalesced_steps must be >= 1")


class SimRequest:
    """One request's mutable progress inside an engine (the engine owns it while admitted)."""

    __slots__ = ("rid", "arrival", "prompt", "max_tokens", "hashes", "hashed_tokens", "computed",
                 "target", "own_blocks", "generated", "o", "c", "d", "finish_g", "admit_seq",
                 "first_token_t", "finish_t", "preemptions", "swapped_tokens", "held", "adapter", "preloaded")

    def __init__(self, rid: int, arrival: float, prompt: int, max_tokens: int,
                 hashes: tuple[int, ...] = (), adapter: str | None = None) -> None:
        self.rid, self.arrival, self.prompt = rid, arrival, max(1, prompt)
        self.max_tokens, self.hashes = max(1, max_tokens), hashes
        self.hashed_tokens = 0
        self.computed = 0
        self.target = self.prompt
        self.own_blocks = 0
        self.generated = 0
        self.o = self.c = self.d = self.finish_g = self.admit_seq = 0
        self.first_token_t: float | None = None
        self.finish_t: float | None = None
        self.preemptions = 0
        self.swapped_tokens = 0
        self.held: tuple[int, ...] = ()
        self.adapter = adapter  # the LoRA adapter it runs with; None: the base model
        # Prompt tokens whose KV arrived from a prefill replica (disaggregated serving): the
        # engine computes only the last prompt token, for its logits, as vLLM's connectors do.
        self.preloaded = 0


@dataclass
class Plan:
    durations: np.ndarray  # seconds of each step in the plan
    cumulative: np.ndarray
    n_dec: int
    chunks: list[tuple[SimRequest, int]]

    @property
    def steps(self) -> int:
        return len(self.durations)

    @property
    def total_s(self) -> float:
        return float(self.cumulative[-1])

    def steps_done_by(self, elapsed: float) -> int:
        """Steps that must complete for a request arriving `elapsed` into the plan to join next."""
        return min(self.steps, int(np.searchsorted(self.cumulative, elapsed, side="right")) + 1)
