"""Loading at disk speed (issue 11, requirement 5): the disk's sequential read bandwidth against
the load throughput of safetensors shards from the weight cache on the same disk.

1. Generate a Llama-shaped model of a few GB with the tiny-model generator (random weights,
   nothing downloaded), in shards like a real checkpoint's.
2. Fill a weight cache from it (read, sha256, write, fsync, publish): the cold-fill figure.
3. For --rounds rounds, in an order rotated each round, drop the page cache and time each
   method over the cache entry's shards: plain readers that define the disk's bandwidth
   (read() into a 16 MiB buffer; O_DIRECT; O_DIRECT with 8 reads in flight; fio, when on
   PATH), then each loader that is installed: safetensors'
   `load_file` (mmap; what vLLM's default loader uses), fastsafetensors (vLLM `--load-format
   fastsafetensors`) and Run:ai's model streamer (`--load-format runai_streamer`), all to CPU
   tensors, every page of which is then touched (an mmap'd tensor is not read until it is). A
   loader's score is its median GB/s over the disk's median (the fastest reader's).

The page cache is dropped with /proc/sys/vm/drop_caches when writable (root), else each shard
gets posix_fadvise(DONTNEED), which drops only clean pages of that file; the JSON says which.

    python -m hbmserve.ops.bench.weight_load --rounds 3 --out out/weight_load.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from hbmserve.cluster.tiny_model import TinyModelShape, write_model
from hbmserve.weights.cache import WeightCache
from hbmserve.weights.sources import LocalDirSource

# ~3.4 GB in float32: 14 layers of hidden 2048 (head_dim 64), a 32k vocabulary; 1 GB shards.
SHAPE = TinyModelShape(hidden_size=2048, intermediate_size=5632, num_hidden_layers=14, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32000)
BUF = 16 * 1024 * 1024
FIO = "disk: fio libaio O_DIRECT 16 MiB iodepth 8"
DISK = ("disk: read() 16 MiB", "disk: O_DIRECT 16 MiB", "disk: O_DIRECT 16 MiB x8 threads", FIO)
THREADS = 8
TARGET_RATIO = 0.8


def drop_page_cache(files: list[Path]) -> str:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        return "posix_fadvise(DONTNEED)"


def read_plain(files: list[Path]) -> None:
    buf = bytearray(BUF)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def read_direct(files: list[Path]) -> None:
    buf = mmap.mmap(-1, BUF)  # page-aligned, as O_DIRECT needs
    try:
        for f in files:
            fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
            try:
                off = 0
                while n := os.preadv(fd, [buf], off):
                    off += n
            finally:
                os.close(fd)
    finally:
        buf.close()


def touch(tensor) -> None:  # noqa: ANN001 (torch is imported lazily)
    """Read one byte of every 4 KiB page: an mmap-backed tensor is not loaded until its pages are
    (safetensors' load_file returns in a third of the disk time otherwise), and the engine would
    read them all anyway. Applied to every loader alike."""
    import torch

    tensor.reshape(-1).view(torch.uint8)[::4096].sum()


def read_direct_parallel(files: list[Path]) -> None:
    """O_DIRECT with THREADS blocks in flight, handed out in file order: still a sequential scan,
    at the queue depth a parallel loader reaches (one read at a time leaves a virtual or NVMe
    disk idle between requests)."""
    from concurrent.futures import ThreadPoolExecutor

    fds = [os.open(f, os.O_RDONLY | os.O_DIRECT) for f in files]
    blocks = [(fd, off) for fd, f in zip(fds, files) for off in range(0, f.stat().st_size, BUF)]
    bufs = [mmap.mmap(-1, BUF) for _ in range(THREADS)]
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            # worker i reads blocks i, i+THREADS, ...: each with its own buffer, in step
            list(pool.map(lambda i: [os.preadv(fd, [bufs[i]], off) for fd, off in blocks[i::THREADS]], range(THREADS)))
    finally:
        for fd in fds:
            os.close(fd)
        for b in bufs:
            b.close()


def read_fio(files: list[Path]) -> None:
    """fio, the standard tool, as a cross-check of the Python readers: libaio, O_DIRECT, 16 MiB
    blocks, 8 in flight, the files one after another."""
    import subprocess

    subprocess.run(["fio", "--name=seqread", "--readonly", "--rw=read", "--bs=16M", "--ioengine=libaio",
                    "--direct=1", "--iodepth=8", "--file_service_type=sequential",
                    "--filename=" + ":".join(str(f) for f in files)], check=True, capture_output=True)


def load_safetensors(files: list[Path]) -> None:
    from safetensors.torch import load_file

    for f in files:
        for t in load_file(f).values():
            touch(t)


def load_fastsafetensors(files: list[Path]) -> None:
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)  # no GPUDirect on this machine
    try:
        loader.add_filenames({0: [str(f) for f in files]})
        fb = loader.copy_files_to_device()
        for key in list(fb.key_to_rank_lidx):
            touch(fb.get_tensor(key))
        fb.close()
    finally:
        loader.close()


def load_runai(files: list[Path]) -> None:
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as s:
        s.stream_files([str(f) for f in files])
        for _name, tensor in s.get_tensors():
            touch(tensor)


LOADERS: dict[str, tuple[str, Callable[[list[Path]], None]]] = {
    # name: (module that must import, loader)
    "safetensors load_file (mmap)": ("safetensors", load_safetensors),
    "fastsafetensors (nogds, cpu)": ("fastsafetensors", load_fastsafetensors),
    "runai_model_streamer": ("runai_model_streamer", load_runai),
}


def available_loaders() -> tuple[dict[str, Callable[[list[Path]], None]], dict[str, str]]:
    import importlib.util

    have, missing = {}, {}
    for name, (module, fn) in LOADERS.items():
        if importlib.util.find_spec(module) is None:
            missing[name] = f"{module} is not installed"
        else:
            have[name] = fn
    return have, missing


@dataclass(frozen=True)
class MethodResult:
    method: str
    median_gbps: float
    runs_gbps: tuple[float, ...]
    ratio_to_disk: float


def summarize(rounds: list[dict[str, float]]) -> tuple[float, list[MethodResult], str]:
    """(disk GB/s, each method's result, the chosen loader): the disk is the fastest plain reader's
    median; the chosen loader the one with the highest median."""
    methods = list(rounds[0])
    med = {m: statistics.median(r[m] for r in rounds) for m in methods}
    disk = max(med[m] for m in DISK if m in med)
    results = [MethodResult(m, med[m], tuple(r[m] for r in rounds), med[m] / disk) for m in methods]
    loaders = [r for r in results if r.method not in DISK]
    return disk, results, max(loaders, key=lambda r: r.median_gbps).method


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", default="~/.cache/hbmserve/bench-weight-load",
                   help="scratch folder on the disk to measure (source model and cache); removed afterwards")
    p.add_argument("--keep", action="store_true", help="keep the generated model and cache")
    p.add_argument("--layers", type=int, default=SHAPE.num_hidden_layers,
                   help="fewer for a quick try (each layer is ~206 MB, the embeddings ~524 MB)")
    p.add_argument("--out", default="out/weight_load.json")
    a = p.parse_args()
    shape = replace(SHAPE, num_hidden_layers=a.layers)
    work = Path(os.path.expanduser(a.work))
    shutil.rmtree(work, ignore_errors=True)
    try:
        t0 = time.monotonic()
        write_model(work / "source", shape, max_shard_size="1GB")
        generate_s = time.monotonic() - t0
        cache = WeightCache(work / "cache", 64 * 1024**3)
        src = LocalDirSource(work / "source")
        manifest = src.manifest()
        drop_page_cache(list((work / "source").iterdir()))
        got = cache.acquire(src, manifest)
        got.release()
        shards = sorted(got.path.glob("*.safetensors"))
        total = sum(f.stat().st_size for f in shards)
        loaders, missing = available_loaders()
        methods = {DISK[0]: read_plain, DISK[1]: read_direct, DISK[2]: read_direct_parallel, **loaders}
        if shutil.which("fio"):
            methods = {FIO: read_fio, **methods}
        else:
            missing[FIO] = "fio is not on PATH (apt-get install fio)"
        rounds, how = [], ""
        for r in range(a.rounds):
            names = list(methods)
            names = names[r % len(names):] + names[: r % len(names)]  # rotate: no method always goes first
            row = {}
            for name in names:
                how = drop_page_cache(shards)
                t = time.perf_counter()
                methods[name](shards)
                row[name] = total / (time.perf_counter() - t) / 1e9
            rounds.append(row)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
        disk, results, chosen = summarize(rounds)
        report = {
            "model": {"shape": asdict(shape), "shards": len(shards), "bytes": total, "generate_s": generate_s},
            "cache_fill": {"bytes": got.bytes_fetched, "seconds": got.seconds,
                           "gbps": got.bytes_fetched / got.seconds / 1e9, "what": "read + sha256 + write + fsync"},
            "page_cache": how, "rounds": rounds, "disk_gbps": disk, "target_ratio": TARGET_RATIO,
            "results": [asdict(r) for r in results], "chosen": chosen, "not_run": missing,
        }
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2))
    print(f"\n{total / 1e9:.2f} GB in {len(shards)} shards; page cache dropped with {how}; "
          f"cache fill {report['cache_fill']['gbps']:.2f} GB/s")
    print("| method | median GB/s | runs | x disk |")
    print("|---|---|---|---|")
    for r in results:
        print(f"| {r.method} | {r.median_gbps:.2f} | {', '.join(f'{x:.2f}' for x in r.runs_gbps)} | "
              f"{r.ratio_to_disk:.2f} |")
    print(f"chosen: {chosen}" + "".join(f"\nnot run: {k} ({v})" for k, v in missing.items()))


if __name__ == "__main__":
    main()
