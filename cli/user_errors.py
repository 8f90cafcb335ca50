"""How every `hbmserve` command fails: one line on stderr naming what is wrong, and an exit code;
never a traceback for a mistake in the user's input."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

_stderr = Console(stderr=True)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    """Print `error: message` on stderr; the caller raises what this returns."""
    _stderr.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def user_errors() -> tuple[type[Exception], ...]:
    """The exceptions that mean the user's input is wrong (a config, trace, model, catalog,
    endpoint or history), each raised with a message naming the field: `fail` with it, exit 2."""
    from hbmserve.autoscale.memory.prior import PriorError
    from hbmserve.capacity.perf.engine_core import EngineConfigError
    from hbmserve.capacity.perf.hardware import CatalogError
    from hbmserve.capacity.perf.model_shape import ModelConfigError
    from hbmserve.capacity.perf.scenario import ScenarioError
    from hbmserve.core.config import ConfigError
    from hbmserve.deployments.control.prometheus_history import HistoryError
    from hbmserve.ops.bench_clients import EndpointError
    from hbmserve.capacity.sim.evaluate import EvalError
    from hbmserve.capacity.traces.arrivals import TraceError

    return (ConfigError, CatalogError, ModelConfigError, TraceError, ScenarioError, EngineConfigError, EvalError,
            EndpointError, PriorError, HistoryError)
