"""What KV-aware routing costs a front door (issue 24, requirement 1), measured on this machine.

Per request: hashing the prompt as the engines do before `choose` can score replicas by what they
hold. For vLLM engines the door tokenizes the prompt with the model's tokenizer (the `tokenizers`
library and the chat template as vLLM renders it, deployments/kv/prompt_tokens.py) and chains
vLLM's sha256_cbor block hashes (routing/engine_hashes.py); for simulated engines it hashes the
text (routing/prefix.py). Per event batch: decoding it and applying it to the door's KV index, the
work each door does for each replica's stream (deployments/kv/kv_subscriber.py), which decides
between one stream per door and one per node.

The tokenizer is the project's tiny model's (a 512-token byte-level BPE): a production tokenizer
with a 128k vocabulary costs more per token; rerun with `--model-dir` on one.

    python -m hbmserve.ops.bench.door_hashing [--model-dir DIR] [--out out/door_hashing.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from hbmserve.core.kv_events import BlockRemoved, BlockStored
from hbmserve.deployments.kv.kv_subscriber import decode_batch, encode_batch
from hbmserve.deployments.kv.prompt_tokens import PromptTokenizer, tokenizer_files
from hbmserve.routing.engine_hashes import engine_block_hashes
from hbmserve.routing.kv_index import KvIndex
from hbmserve.routing.prefix import chat_prompt_text, prompt_block_hashes

WORDS = "the cache lives in memory and the router sends each prompt where its blocks are held".split()
PROMPT_CHARS = (2_000, 8_000, 32_000)  # about 500, 2,000 and 8,000 tokens of English
BLOCK = 16


def _best_us(fn, repeat: int) -> float:
    """The median of `repeat` timings of `fn()`, in microseconds (one warm-up call first)."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def _messages(chars: int) -> list[dict]:
    text = " ".join(WORDS[i % len(WORDS)] for i in range(chars // 5))[:chars]
    return [{"role": "system", "content": text}, {"role": "user", "content": "where is it?"}]


def measure(model_dir: Path, repeat: int) -> dict:
    tok = PromptTokenizer(tokenizer_files(model_dir))
    rows = []
    for chars in PROMPT_CHARS:
        messages = _messages(chars)
        ids = tok.chat(messages)
        rows.append({"prompt_chars": chars, "prompt_tokens": len(ids),
                     "tokenize_us": _best_us(lambda: tok.chat(messages), repeat),
                     "vllm_hashes_us": _best_us(lambda: engine_block_hashes(ids, BLOCK), repeat),
                     "text_hashes_us": _best_us(lambda: prompt_block_hashes(chat_prompt_text(messages)), repeat)})
    # One engine step's batch: a prefill storing 32 blocks and a finished request's 32 freed.
    batch = encode_batch(time.time(), (BlockStored(tuple(range(1, 33)), 0), BlockRemoved(tuple(range(101, 133)))), BLOCK)
    index, seq = KvIndex(), [0]

    def apply_one() -> None:
        index.apply(decode_batch("r0", seq[0], batch), time.time())
        seq[0] += 1

    return {"requests": rows, "batch_bytes": len(batch), "batch_decode_apply_us": _best_us(apply_one, repeat * 10)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, default=None, help="a model folder with tokenizer files (default: "
                   "the tiny model, written to a temporary folder)")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            from hbmserve.cluster.tiny_model import write_model

            model_dir = write_model(Path(tmp) / "tiny-llama")
        result = measure(model_dir, args.repeat)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
