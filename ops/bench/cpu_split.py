"""Where the CPU goes while a benchmark runs: every process on the machine, grouped by what it is
(the front door, the engine replica, vLLM's engine core, Ray's daemons, the load client), its
user + system seconds read from /proc (psutil) at the start and the end of a measured run.

A process that ends inside the run is not counted and one that starts inside it counts whole;
the runs measured here start and end none. Per 1,000 output tokens, the split says what each part of
the data path costs a token (issue 22: the door's share against the engine's).

`cpu_s` reads one process to the nanosecond, for the short runs of the simulated pair (door_cpu,
relay_floor).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

GROUPS = ("door", "replica", "engine", "ray", "client", "other")


def group_of(cmdline: str, pid: int, client_pid: int) -> str:
    if pid == client_pid:
        return "client"
    if "VLLM::" in cmdline:  # vLLM's engine core and its CPU worker name themselves VLLM::EngineCore, VLLM::Worker
        return "engine"
    if "FrontDoor" in cmdline or "frontdoor" in cmdline:
        return "door"
    if "ServeReplica" in cmdline or "vllm.entrypoints.openai.api_server" in cmdline:
        return "replica"  # the process that answers HTTP for the engine: hbmserve's replica or bare vLLM's server
    if any(k in cmdline for k in ("raylet", "gcs_server", "dashboard", "log_monitor", "ray::", "default_worker",
                                  "runtime_env", "monitor.py", "/ray/", "ray.util")):
        return "ray"
    return "other"


def cpu_s(pid: int) -> float:
    """CPU seconds a process has used, to the nanosecond: its threads' run time as the scheduler
    counts it (/proc/PID/task/*/schedstat). /proc/PID/stat's utime + stime count 10 ms ticks, and
    HAProxy relaying a small run read 0 there, once, and failed CI's check that it did any work.
    Every server measured here keeps its threads for the run, so none's time leaves with it."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, IndexError, ValueError):  # a thread that ended between the listing and the read
            continue
    if total:
        return total / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # no schedstat: ticks
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _times() -> dict[int, tuple[str, float]]:
    me = os.getpid()
    out, parent = {}, {}
    for p in psutil.process_iter(["pid", "ppid", "name", "cmdline", "cpu_times"]):
        try:
            t = p.info["cpu_times"]
            if t is None:
                continue
            # The name too: one run charged the engine core's CPU to "other", so its command line,
            # as read then, lacked the VLLM:: title that setproctitle also writes into the name.
            text = " ".join(p.info["cmdline"] or []) + " " + (p.info["name"] or "")
            out[p.info["pid"]] = (group_of(text, p.info["pid"], me), t.user + t.system)
            parent[p.info["pid"]] = p.info["ppid"]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    # A process the replica started is its engine core, whatever it is called: a later run still
    # charged the engine to "other", with neither its name nor its command line read as vLLM's.
    for pid, (group, t) in out.items():
        if group == "other" and out.get(parent[pid], ("",))[0] == "replica":
            out[pid] = ("engine", t)
    return out


@dataclass(frozen=True)
class CpuSplit:
    seconds: dict[str, float]  # group -> CPU seconds over the run

    def per_1k(self, tokens: int) -> dict[str, float]:
        """CPU-seconds per 1,000 output tokens, per group."""
        return {g: round(1000 * s / max(tokens, 1), 4) for g, s in self.seconds.items()}


class CpuMeter:
    """`with CpuMeter() as m: ...` then `m.split`."""

    def __enter__(self) -> CpuMeter:
        self._start = _times()
        return self

    def __exit__(self, *exc: object) -> None:
        end = _times()
        seconds = dict.fromkeys(GROUPS, 0.0)
        for pid, (group, t) in end.items():
            seconds[group] += t - self._start.get(pid, (group, 0.0))[1]
        self.split = CpuSplit({g: round(s, 3) for g, s in seconds.items()})
