"""The data-path benchmark's arithmetic (ops/bench/serving_overhead.py) and its CPU split
(ops/bench/cpu_split.py): every round is kept with its spread, and CPU is charged to the group
of the process that burnt it, measured on a real busy process."""

from __future__ import annotations

import subprocess
import sys

from hbmserve.ops.bench.cpu_split import CpuMeter, CpuSplit, cpu_s, group_of
from hbmserve.ops.bench.serving_overhead import ratios, spread, summarize


def _side(tps: float, ttft: float, tpot: float, door: float = 0.0) -> dict:
    return {16: {"output_throughput": tps, "median_ttft_ms": ttft, "median_tpot_ms": tpot, "p95_ttft_ms": ttft,
                 "p95_tpot_ms": tpot, "output_tokens": 1000, "cpu_s_per_1k_tokens": {"door": door, "engine": 1.0}}}


def test_a_steady_loss_shows_in_every_round_not_only_the_median():
    rounds = [{"bare": _side(1000, 10, 5), "hbmserve": _side(tps, 12, 6, door=0.2)} for tps in (900, 500, 950)]
    r = ratios(rounds, "hbmserve", "bare", 16)
    assert r["throughput"] == [0.9, 0.5, 0.95] and r["ttft_p50"] == [1.2] * 3 and r["tpot_p50"] == [1.2] * 3
    s = summarize(rounds, ("bare", "hbmserve"), (16,))
    t = s["c16 throughput_ratio hbmserve/bare"]
    assert (t["median"], t["min"], t["max"]) == (0.9, 0.5, 0.95) and abs(t["mean"] - 2.35 / 3) < 1e-9
    assert s["c16 hbmserve cpu_s_per_1k door"] == 0.2 and s["c16 hbmserve_output_throughput"] == 900
    assert spread([2.0])["rounds"] == [2.0]


def test_processes_are_grouped_by_what_they_are():
    assert group_of("ray::ServeReplica:hbmserve-frontdoor:FrontDoor", 5, 1) == "door"
    assert group_of("ray::ServeReplica:tiny:tiny-engine", 5, 1) == "replica"
    assert group_of("python -m vllm.entrypoints.openai.api_server --port 8100", 5, 1) == "replica"
    assert group_of("VLLM::EngineCore", 5, 1) == group_of("VLLM::Worker", 5, 1) == "engine"
    assert group_of("/x/raylet --raylet_socket_name=...", 5, 1) == "ray"
    assert group_of("anything", 1, 1) == "client"
    assert group_of("sshd", 5, 1) == "other"


def test_the_meter_charges_a_busy_process_to_its_group():
    with CpuMeter() as m:
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"],
                       check=True)
    # The child ended inside the run: not counted; this process spent little.
    assert m.split.seconds["client"] < 0.3
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with CpuMeter() as m:
            subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)"], check=True)
    finally:
        busy.kill()
        busy.wait()
    assert m.split.seconds["other"] >= 0.2  # the busy loop, alive across the run
    assert CpuSplit({"door": 0.5}).per_1k(2000) == {"door": 0.25}


def test_a_few_milliseconds_of_another_process_s_cpu_are_counted_finer_than_a_tick():
    """door_cpu's reader counts a server's CPU to the nanosecond: 10 ms ticks read a light relay's
    small run as 0, or as a whole tick (HAProxy's read 0 once and failed CI)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys, time\nprint(flush=True)\nsys.stdin.readline()\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.003: pass\nprint(flush=True)\nsys.stdin.readline()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()  # started: its start-up is not counted
        before = cpu_s(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        child.stdout.readline()  # the 3 ms burnt
        used = cpu_s(child.pid) - before
    finally:
        child.kill()
        child.wait()
    assert 0.003 <= used < 0.0095  # no multiple of a 10 ms tick


def test_the_door_cpu_loop_streams_every_token_on_every_side(tmp_path):
    """ops/bench/door_cpu.py end to end on a small load: five real processes on loopback (the
    replica, the door, Ray's HAProxy, a door with its replica in one process, the bare Python relay,
    the door's listener and relay deciding nothing, the client). Enough tokens that the door's relay costs
    several of the kernel's 10 ms CPU ticks (a tick of idle polling on the direct side must not
    tie it)."""
    import json

    out = tmp_path / "door_cpu.json"
    subprocess.run([sys.executable, "-m", "hbmserve.ops.bench.door_cpu", "--rounds", "1", "--concurrency", "4",
                    "--tokens", "32", "--requests", "24", "--sides", "direct", "door", "haproxy", "inproc", "pyrelay", "asgirelay",
                    "--out", str(out)],
                   check=True, timeout=120, capture_output=True)
    rows = json.loads(out.read_text())["rounds"]
    assert [r["side"] for r in rows] == ["direct", "door", "haproxy", "inproc", "pyrelay", "asgirelay"]
    assert all(r["tokens"] == 24 * 32 for r in rows)
    direct, door, proxied, inproc, relayed, layers = rows
    assert relayed["pyrelay_cpu_ms_per_1k"] > 0 and door["pyrelay_cpu_ms_per_1k"] < relayed["pyrelay_cpu_ms_per_1k"]
    assert layers["asgirelay_cpu_ms_per_1k"] > 0 and door["asgirelay_cpu_ms_per_1k"] < layers["asgirelay_cpu_ms_per_1k"]
    assert inproc["inproc_cpu_ms_per_1k"] > 0 and inproc["door_cpu_ms_per_1k"] < door["door_cpu_ms_per_1k"]
    assert door["door_cpu_ms_per_1k"] > 0 and direct["door_cpu_ms_per_1k"] < door["door_cpu_ms_per_1k"]
    assert door["haproxy_cpu_ms_per_1k"] < proxied["haproxy_cpu_ms_per_1k"]  # each side's relay measured


_NAMED_BY_THE_KERNEL_ONLY = """
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, b"VLLM::EngineCor", 0, 0, 0)  # PR_SET_NAME: the name, not the command line
print("ready", flush=True)
sys.stdin.readline()
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
print("done", flush=True)
sys.stdin.readline()
"""


def test_a_process_whose_title_is_only_in_its_name_is_still_grouped():
    """An engine core whose command line lacks its VLLM:: title is still the engine's (a run
    once charged one to "other")."""
    child = subprocess.Popen([sys.executable, "-c", _NAMED_BY_THE_KERNEL_ONLY], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with CpuMeter() as m:
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "done"
        assert m.split.seconds["engine"] >= 0.2, m.split.seconds
    finally:
        child.kill()
        child.wait()


def test_a_trace_becomes_vllm_s_custom_dataset_with_its_output_lengths_capped(tmp_path):
    import json

    from hbmserve.ops.bench.serving_overhead import trace_dataset

    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,900,44\n1.0,1200,1500\n")
    rows = [json.loads(line) for line in trace_dataset(trace, 800, tmp_path / "d" / "set.jsonl").read_text().splitlines()]
    assert [r["output_tokens"] for r in rows] == [44, 800]
    assert all(isinstance(r["prompt"], str) and r["prompt"] for r in rows)


def test_a_process_the_replica_started_is_charged_to_the_engine_whatever_it_is_called():
    """vLLM's engine core is a child of the replica process; one run read it under neither its
    title nor its command line, and the meter charged it to "other"."""
    replica = subprocess.Popen([sys.executable, "-c", "import subprocess, sys\n"
                                "c = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
                                "print(c.pid, flush=True)\nsys.stdin.readline()\nc.kill()\nc.wait()",
                                "ServeReplica:tiny:engine"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        replica.stdout.readline()  # its busy child runs
        with CpuMeter() as m:
            subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)"], check=True)
    finally:
        replica.communicate("stop\n", timeout=10)
    assert m.split.seconds["engine"] >= 0.2  # nothing else here is an engine: without the rule, 0
