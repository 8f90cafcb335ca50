"""Hooks for every test tier.

The process exits with pytest's own status once the report is written. Stop 48's CI printed the
full report (1 failed, 1896 passed) and then the interpreter segfaulted in its shutdown, in the
native threads Ray, gRPC and vLLM leave behind; a green run could end the same way and read red.
So after the last hook the session shuts Ray down (what its atexit handler would do) and leaves
through os._exit, past the finalisers that crash.
"""

from __future__ import annotations

import os
import sys

import pytest

_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    status = config.stash.get(_EXIT_STATUS, None)
    if status is None or os.environ.get("HBMSERVE_TEST_NORMAL_EXIT"):
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
