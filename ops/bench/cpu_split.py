"""Where the CPU goes while a benchmark runs: every process on the machine, grouped by what it is
(the front door, the engine replica, vLLM's engine core, Ray's daemons, the load client), its
user + system seconds read from /proc (psutil) at the start and the end of a measured run.

A process that ends inside the run is not counted and one that starts inside it counts whole;
the runs measured here start and end none. Per 1,000 output tokens, the split says what each part of
the data path costs a token (issue 22: the door's share against the engine's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
