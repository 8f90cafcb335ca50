"""A replica's vLLM OpenAI-server argument list, built and checked by vLLM's own parser.

`engine_args.vllm_launch` (pure) gives hbmserve's arguments from the typed fields plus the
pass-through map `engine_settings.vllm_args`. How a map entry is spelt on the command line is
the argument's business: a list is several words for `--lora-modules`, one JSON word for
`--allowed-origins` and a repeated flag for `--middleware`; `false` is `--no-X` for a switch and
no word at all for an on-only flag. So the map becomes argv here, with the parser that reads it.

The replica (vllm_server.py) and the deploy check (hbmserve.cluster.checks) go through these
same functions: what `hbmserve deploy` accepted is exactly what the replica parses, and a bad
key or value is a config error naming the field before any replica starts.

vLLM is imported inside the functions: importing it takes seconds and needs a platform.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from typing import Any, Callable

from hbmserve.core.engine_settings import vllm_arg_refusal
from hbmserve.deployments.replica.engine_args import EngineLaunch

# What vLLM's own start-up checks raise, besides its VLLMError family (a chat template that is
# not there): TypeError ("--enable-auto-tool-choice requires --tool-call-parser"), KeyError (an
# unknown parser), ValueError (pydantic's ValidationError too).
_VLLM_CHECK_ERRORS = (ValueError, TypeError, KeyError)


class VllmArgsError(ValueError):
    """vLLM refuses the arguments. `key`: the vllm_args key at fault, or None when no single key
    is (hbmserve's own arguments, or a combination of keys)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def serve_parser() -> argparse.ArgumentParser:
    """The parser of vLLM's OpenAI server (what `vllm serve` parses with), raising VllmArgsError
    where argparse would print usage and exit the process. Without vLLM installed, raises
    ModuleNotFoundError with name "vllm"."""
    import vllm  # noqa: F401  first, so that a missing vLLM fails as itself, not as a submodule
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message: str):  # type: ignore[override]
            raise VllmArgsError(message)

    return make_arg_parser(Parser(prog="vllm serve"))


def launch_argv(parser: argparse.ArgumentParser, launch: EngineLaunch) -> list[str]:
    """hbmserve's own arguments, then the vllm_args map, as one argv; raises VllmArgsError."""
    argv = list(launch.cli_args)
    for key, value in launch.vllm_args:
        argv += _words(parser, key, value)
    return argv


def parse_launch(launch: EngineLaunch) -> argparse.Namespace:
    """The namespace a replica hands to vLLM: parsed, then put through the checks vLLM's own
    server runs before it loads the engine, with the tool and reasoning parser plugins that
    server imports first (api_server's main and run_server_worker)."""
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.entrypoints.launchers.launcher import validate_api_server_args
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    parser = serve_parser()
    args = _parse(parser, launch_argv(parser, launch))
    validate_parsed_serve_args(args)
    if args.tool_parser_plugin and len(args.tool_parser_plugin) > 3:
        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    if args.reasoning_parser_plugin and len(args.reasoning_parser_plugin) > 3:
        ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)
    validate_api_server_args(args)
    return args


def launch_problems(parser: argparse.ArgumentParser, launch: EngineLaunch) -> list[VllmArgsError]:
    """All that vLLM refuses in `launch` short of loading the model: argument names, values, and
    vLLM's own start-up checks. Empty when a replica's vLLM (of this version) will accept it."""
    base = list(launch.cli_args)
    try:
        _parse(parser, base)
    except VllmArgsError as err:
        return [VllmArgsError(f"vLLM {_version()} refuses the arguments hbmserve builds for this model: {err}")]
    problems: list[VllmArgsError] = []
    words: list[str] = []
    for key, value in launch.vllm_args:
        try:
            own = _words(parser, key, value)
            _parse(parser, base + own)  # alone, so that a bad value is pinned on its key
        except VllmArgsError as err:
            problems.append(VllmArgsError(str(err), key))
            continue
        words += own
    if problems:
        return problems
    keys = [key for key, _ in launch.vllm_args]
    try:
        args = _parse(parser, base + words)
    except VllmArgsError as err:
        return [VllmArgsError(str(err), _key_named(str(err), keys))]
    return _startup_problems(args, keys)


def _startup_problems(args: argparse.Namespace, keys: list[str]) -> list[VllmArgsError]:
    """vLLM's own checks on a parsed namespace, those that need neither the model nor a device.
    Parser plugins are files on the replicas' machines, not necessarily here: a parser name is
    checked only where no plugin could register it."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.exceptions import VLLMError
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    problems: list[VllmArgsError] = []

    def run(key: str | None, check: Callable[[], Any]) -> Any:
        try:
            return check()
        except (*_VLLM_CHECK_ERRORS, VLLMError) as err:
            text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
            # VLLMValidationError names its argument (chat_template); the others name the flag.
            named = getattr(err, "parameter", None)
            problems.append(VllmArgsError(text, key or (named if named in keys else _key_named(text, keys))))
            return None

    run(None, lambda: validate_parsed_serve_args(args))
    if args.tool_call_parser and not args.tool_parser_plugin:
        run("tool_call_parser", lambda: _registered("tool call parser", args.tool_call_parser,
                                                    ToolParserManager.list_registered(), "tool_parser_plugin"))
    if args.reasoning_parser and not args.reasoning_parser_plugin:
        run("reasoning_parser", lambda: _registered("reasoning parser", args.reasoning_parser,
                                                    ReasoningParserManager.list_registered(),
                                                    "reasoning_parser_plugin"))
    # Builds vLLM's engine arguments as the replica will (loading vLLM's general plugins, which
    # may register load formats); the engine config itself needs the model, so it waits.
    engine_args = run(None, lambda: AsyncEngineArgs.from_cli_args(args))
    if engine_args is not None and "load_format" in keys:
        from vllm.model_executor.model_loader import get_model_loader

        run("load_format", lambda: get_model_loader(engine_args.create_load_config()))
    return problems


def _registered(kind: str, name: str, registered: list[str], plugin_key: str) -> None:
    if name not in registered:
        raise KeyError(f"vLLM {_version()} has no {kind} named {name!r} (choose from "
                       f"{', '.join(sorted(registered))}; or register one with {plugin_key})")


def _words(parser: argparse.ArgumentParser, key: str, value: Any) -> list[str]:
    """One vllm_args entry as argv words, shaped by its argparse action; raises VllmArgsError."""
    option = "--" + key.replace("_", "-")
    # Exact names only: argparse would also take any unambiguous prefix (--tensor-parallel),
    # which would let a key slip past the refusals below.
    action = parser._option_string_actions.get(option)
    if action is None or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        raise VllmArgsError(f"not an argument of vLLM {_version()}'s OpenAI server{_did_you_mean(parser, key)}", key)
    refusal = vllm_arg_refusal(action.dest)  # by destination: vLLM's aliases too
    if refusal is not None:
        raise VllmArgsError(f"not allowed in vllm_args: {refusal}", key)
    positive = "--" + option.removeprefix("--no-")
    if isinstance(action, argparse.BooleanOptionalAction) and option != positive and positive in action.option_strings:
        raise VllmArgsError(f"write {positive[2:].replace('-', '_')}: false instead", key)
    if value is None:
        return []  # vLLM's default
    if action.nargs == 0:  # a switch (--X / --no-X) or an on-only flag
        if not isinstance(value, bool):
            raise VllmArgsError(f"an on/off flag: write true or false, not {value!r}", key)
        off = [o for o in action.option_strings if o.startswith("--no-")]
        return [option] if value else off[:1]  # an on-only flag is off when absent
    if isinstance(value, list) and isinstance(action, argparse._AppendAction):
        return [f"{option}={_text(v)}" for v in value]
    if isinstance(value, list) and action.nargs not in (None, "?"):
        return [option, *map(_text, value)]  # a multi-value argument: one word per item
    # One word; `=` keeps a value that starts with "-" from reading as a flag.
    return [f"{option}={_text(value)}"]


def _text(value: Any) -> str:
    # Strings as written; everything else as JSON, which vLLM's JSON-typed arguments expect and
    # which spells numbers and booleans as a command line would.
    return value if isinstance(value, str) else json.dumps(value)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    try:
        return parser.parse_args(argv)
    except VllmArgsError:
        raise
    except ValueError as err:  # FlexibleArgumentParser's own checks raise ValueError directly
        raise VllmArgsError(str(err)) from None
    except SystemExit as exit_:  # an action that exits on its own (--help is refused above)
        raise VllmArgsError(f"vLLM's argument parser exited ({exit_.code})") from None


def _key_named(message: str, keys: list[str]) -> str | None:
    """The vllm_args key whose flag a vLLM message names (--enable-auto-tool-choice), if any."""
    for key in keys:
        if re.search(rf"(?<![\w-])--{re.escape(key.replace('_', '-'))}(?![\w-])", message):
            return key
    return None


def _did_you_mean(parser: argparse.ArgumentParser, key: str) -> str:
    names = {o[2:].replace("-", "_") for o, a in parser._option_string_actions.items()
             if o.startswith("--") and not o.startswith("--no-")
             and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))}
    close = difflib.get_close_matches(key, sorted(names - {key}), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def _version() -> str:
    from vllm import __version__

    return __version__
