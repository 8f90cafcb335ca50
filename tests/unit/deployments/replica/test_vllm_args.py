"""engine_settings.vllm_args: the schema's refusals, the replica's argv through vLLM's own parser,
and the deploy-time check (`hbmserve deploy`/`up` fail with the field's path before any Ray).

Real vLLM parser, no engine: parsing and vLLM's pre-load checks only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

import hbmserve
from hbmserve.cluster.checks import load_deployable
from hbmserve.core.config import ConfigError, ModelSpec, parse_cluster_spec
from hbmserve.deployments.replica.engine_args import vllm_launch
from hbmserve.deployments.replica.vllm_argv import launch_argv, launch_problems, parse_launch, serve_parser

FIELD = "models.0.engine_settings.vllm_args"
# Every value shape the map supports, on arguments of both the engine and the OpenAI frontend.
GOOD = {
    "enable_lora": True,
    "max-loras": 4,  # dash form
    "lora_modules": [{"name": "sql", "path": "/adapters/sql"}, "chat=/adapters/chat"],  # multi-value
    "tool_call_parser": "hermes",  # frontend
    "enable_auto_tool_choice": True,  # frontend; needs tool_call_parser (checked together)
    "load_format": "safetensors",
    "enable_sleep_mode": True,
    "allowed_origins": ["https://app.example"],  # one JSON word on vLLM's command line
    "middleware": ["pkg.mw_a", "pkg.mw_b"],  # a repeated flag on vLLM's command line
    "compilation_config": {"mode": 0},  # a JSON argument
    "enable_log_requests": False,  # a switch: --no-enable-log-requests
    "aggregate_engine_logging": False,  # an on-only flag: off is no word at all
    "chat_template": None,  # vLLM's default
}


def _model(vllm_args: dict, **fields) -> dict:
    return {"name": "m", "source": "/models/m", "engine_settings": {"vllm_args": vllm_args}, **fields}


def _spec(vllm_args: dict, **fields):
    return parse_cluster_spec({"models": [_model(vllm_args, **fields)]}, "c.yaml")


def _config_file(tmp_path: Path, vllm_args: dict, **fields) -> Path:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({"models": [_model(vllm_args, **fields)]}, sort_keys=False))
    return cfg


@pytest.fixture(scope="module")
def parser():
    return serve_parser()


# --- the schema (core; no vLLM) ---------------------------------------------------------------


def test_keys_are_kept_in_underscore_form_with_their_values():
    args = _spec(GOOD).models[0].engine_settings.vllm_args
    assert "max_loras" in args and "max-loras" not in args
    assert args["max_loras"] == 4 and args["enable_lora"] is True and args["chat_template"] is None
    assert args["lora_modules"][0] == {"name": "sql", "path": "/adapters/sql"}


def test_the_map_survives_the_trip_to_the_replica():
    """Replicas get their ModelSpec as JSON (serve_app.EngineReplica)."""
    model = _spec(GOOD).models[0]
    assert ModelSpec.model_validate_json(model.model_dump_json()) == model


@pytest.mark.parametrize(("key", "words"), [
    ("max_num_seqs", ["typed field", "engine_settings.max_num_seqs"]),
    ("max-model-len", ["typed field", "engine_settings.max_model_len"]),
    ("tensor-parallel-size", ["parallelism.tp"]),
    ("pipeline_parallel_size", ["parallelism.pp"]),
    ("kv_offloading_size", ["engine_settings.kv_offload_gib"]),
    ("served_model_name", ["`name`"]),
    ("model", ["`source`"]),
    ("port", ["serve.http.port"]),
    ("api_key", ["serve.auth.keys_file"]),
    ("kv_events_config", ["engine_settings.kv_events"]),
    ("prefix_caching_hash_algo", ["engine_settings.kv_events"]),
    ("distributed_executor_backend", ["engine and parallelism"]),
    ("data_parallel_size", ["one engine per replica", "replicas"]),
    ("disable_log_stats", ["engine statistics"]),
    ("ssl_keyfile", ["does not run that server"]),
    ("headless", ["does not run that server"]),
    ("--enable-lora", ["without leading dashes", "enable_lora"]),
    ("compilation_config.mode", ["a mapping", "compilation_config: {mode: 3}"]),
])
def test_keys_hbmserve_owns_are_refused_naming_the_field_to_use(key, words):
    with pytest.raises(ConfigError) as err:
        _spec({key: 1, "enable_lora": True})
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 1 and lines[0].startswith(f"  {FIELD}.{key}: "), lines
    for w in words:
        assert w in lines[0]


def test_both_spellings_of_one_argument_are_refused():
    with pytest.raises(ConfigError, match=f"{FIELD}: max-loras and max_loras are the same vLLM argument"):
        _spec({"max-loras": 2, "max_loras": 4})


def test_the_simulated_engine_refuses_vllm_args():
    """The simulator runs no vLLM: it could not load the adapter or parse tool calls, so a
    config that deploys on `engine: sim` must not promise them."""
    with pytest.raises(ConfigError) as err:
        _spec({"enable_lora": True}, engine="sim")
    assert "models.0: " in str(err.value)
    assert "engine_settings.vllm_args (enable_lora) needs engine vllm-cpu or vllm-gpu" in str(err.value)
    assert _spec({}, engine="sim").models[0].engine_settings.vllm_args == {}


# --- the replica's argv, through vLLM's own parser -----------------------------------------------


def test_good_map_reaches_the_namespace_the_replica_hands_vllm(parser):
    launch = vllm_launch(_spec(GOOD).models[0], "127.0.0.1", 8000)
    assert launch_problems(parser, launch) == []
    argv = launch_argv(parser, launch)
    assert argv[:len(launch.cli_args)] == list(launch.cli_args)
    extra = argv[len(launch.cli_args):]
    assert extra == [
        "--enable-lora", "--max-loras=4",
        "--lora-modules", '{"name": "sql", "path": "/adapters/sql"}', "chat=/adapters/chat",
        "--tool-call-parser=hermes", "--enable-auto-tool-choice", "--load-format=safetensors",
        "--enable-sleep-mode", '--allowed-origins=["https://app.example"]',
        "--middleware=pkg.mw_a", "--middleware=pkg.mw_b", '--compilation-config={"mode": 0}',
        "--no-enable-log-requests",
    ]
    args = parse_launch(launch)  # what VLLMHttpServer.start builds the engine and the app from
    assert (args.enable_lora, args.max_loras, args.enable_sleep_mode, args.load_format) == (True, 4, True, "safetensors")
    assert [(lora.name, lora.path) for lora in args.lora_modules] == [("sql", "/adapters/sql"), ("chat", "/adapters/chat")]
    assert (args.tool_call_parser, args.enable_auto_tool_choice) == ("hermes", True)
    assert args.allowed_origins == ["https://app.example"] and args.middleware == ["pkg.mw_a", "pkg.mw_b"]
    assert int(args.compilation_config.mode) == 0
    assert args.enable_log_requests is False and args.aggregate_engine_logging is False
    # hbmserve's own arguments are untouched.
    assert (args.model, args.served_model_name, args.max_num_seqs) == ("/models/m", ["m"], 64)


def test_dash_and_underscore_keys_give_the_same_argv(parser):
    dashed = vllm_launch(_spec({"max-loras": 3, "enable-lora": True}).models[0], "h", 1)
    underscored = vllm_launch(_spec({"max_loras": 3, "enable_lora": True}).models[0], "h", 1)
    assert launch_argv(parser, dashed) == launch_argv(parser, underscored)
    assert "--max-loras=3" in launch_argv(parser, dashed)


def test_a_model_with_kv_events_publishes_them_where_its_relay_listens_hashed_as_the_doors_hash(parser, tmp_path):
    from hbmserve.deployments.kv.engine_relay import EngineKvRelay
    from hbmserve.deployments.replica.engine_args import publishes_kv_events

    model = _spec({}).models[0]
    on = model.model_copy(update={"engine_settings": model.engine_settings.model_copy(
        update={"enable_prefix_caching": True})})
    off = on.model_copy(update={"engine_settings": on.engine_settings.model_copy(update={"kv_events": False})})
    assert (publishes_kv_events(model), publishes_kv_events(on), publishes_kv_events(off)) == (False, True, False)
    relay = EngineKvRelay(str(tmp_path))
    args = parse_launch(vllm_launch(on, "h", 1, relay.vllm_config()))
    cfg = args.kv_events_config
    assert (cfg.enable_kv_cache_events, cfg.publisher) == (True, "zmq")
    assert cfg.endpoint == f"ipc://{relay.pub_path}" and cfg.replay_endpoint == f"ipc://{relay.replay_path}"
    assert args.prefix_caching_hash_algo == "sha256_cbor" and args.enable_prefix_caching


def test_an_empty_map_changes_nothing(parser):
    launch = vllm_launch(_spec({}).models[0], "h", 1)
    assert launch_argv(parser, launch) == list(launch.cli_args)
    assert launch_problems(parser, launch) == []


# --- the deploy-time check (what `hbmserve up`/`deploy` run) ----------------------------------


@pytest.mark.parametrize(("vllm_args", "expected"), [
    ({"max_lora": 4},
     [f"{FIELD}.max_lora: not an argument of vLLM 0.32.0's OpenAI server; did you mean max_loras?"]),
    ({"max_loras": "many"}, [f"{FIELD}.max_loras: argument --max-loras: invalid int value: 'many'"]),
    ({"load_format": "bogus"}, [f"{FIELD}.load_format: Load format `bogus` is not supported"]),
    ({"kv_cache_dtype": "fp7"}, [f"{FIELD}.kv_cache_dtype: argument --kv-cache-dtype: invalid choice: 'fp7'"]),
    ({"enable_lora": "yes"}, [f"{FIELD}.enable_lora: an on/off flag: write true or false, not 'yes'"]),
    ({"no_enable_lora": True}, [f"{FIELD}.no_enable_lora: write enable_lora: false instead"]),
    # vLLM's alias of a typed field: caught by the argument's destination, not its name.
    ({"device_memory_utilization": 0.5},
     [f"{FIELD}.device_memory_utilization: not allowed in vllm_args: it is a typed field: "
      "set engine_settings.gpu_memory_utilization instead"]),
    ({"tool_call_parser": "hermess"}, [f"{FIELD}.tool_call_parser: vLLM 0.32.0 has no tool call parser named 'hermess'"]),
    ({"enable_auto_tool_choice": True},
     [f"{FIELD}.enable_auto_tool_choice: Error: --enable-auto-tool-choice requires --tool-call-parser"]),
    ({"chat_template": "/nonexistent/tmpl.jinja"},
     [f"{FIELD}.chat_template: The supplied chat template string (/nonexistent/tmpl.jinja) appears path-like"]),
    ({"compilation_config": {"level": 3}},
     [f"{FIELD}.compilation_config: argument --compilation-config/-cc: 1 validation error for CompilationConfig"]),
    # Every bad key is reported, each on its own line.
    ({"max_lora": 4, "max_loras": "many", "enable_lora": True},
     [f"{FIELD}.max_lora: not an argument", f"{FIELD}.max_loras: argument --max-loras: invalid int value"]),
])
def test_deploy_check_names_the_bad_key_with_vllms_reason(tmp_path, vllm_args, expected):
    with pytest.raises(ConfigError) as err:
        load_deployable(_config_file(tmp_path, vllm_args))
    text = str(err.value)
    assert text.startswith(f"invalid config {tmp_path / 'bad.yaml'}:\n")
    lines = [line.strip() for line in text.splitlines()[1:] if line.startswith("  models.")]
    assert len(lines) == len(expected), text
    for line, prefix in zip(lines, expected):
        assert line.startswith(prefix), text


def test_deploy_check_accepts_the_good_map_on_both_vllm_engines(tmp_path):
    for engine in ("vllm-cpu", "vllm-gpu"):
        spec = load_deployable(_config_file(tmp_path, GOOD, engine=engine, parallelism={"tp": 2}))
        assert spec.models[0].engine_settings.vllm_args["max_loras"] == 4


def test_without_vllm_a_vllm_model_is_a_config_error_and_a_sim_model_is_fine(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now fails as on a laptop without it
    with pytest.raises(ConfigError, match=r"models\.0\.engine: vllm-cpu is checked with vLLM's own argument "
                                          r"parser before any replica starts, and vLLM is not installed here"):
        load_deployable(_config_file(tmp_path, {}))
    cfg = tmp_path / "sim.yaml"
    cfg.write_text("models: [{name: s, source: /s, engine: sim}]\n")
    assert load_deployable(cfg).models[0].name == "s"


def test_a_broken_vllm_install_is_not_swallowed(tmp_path, monkeypatch):
    import hbmserve.deployments.replica.vllm_argv as vllm_argv

    def broken():
        raise ModuleNotFoundError("No module named 'torch._C'", name="torch._C")

    monkeypatch.setattr(vllm_argv, "serve_parser", broken)
    with pytest.raises(ModuleNotFoundError, match="torch._C"):
        load_deployable(_config_file(tmp_path, {}))


# --- the command line -------------------------------------------------------------------------


def test_hbmserve_deploy_exits_2_naming_the_field_before_touching_ray(tmp_path):
    """Black box: `python -m hbmserve deploy bad.yaml` with a `ray` that fails on import first on
    the path and no RAY_ADDRESS. Exit 2 and the field's path prove the check ran; no Ray error
    proves it ran before any connection (or a head) was attempted."""
    fake = tmp_path / "no_ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise RuntimeError('hbmserve imported ray before checking the config')\n")
    cfg = _config_file(tmp_path, {"max_lora": 4, "max_loras": "many"})
    pkg_parent = str(Path(hbmserve.__file__).resolve().parent.parent)  # what PYTHONPATH points at
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "no_ray"), os.environ.get("PYTHONPATH", pkg_parent)])
    proc = subprocess.run([sys.executable, "-m", "hbmserve", "deploy", str(cfg)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "imported ray" not in proc.stderr
    assert f"  {FIELD}.max_lora: not an argument of vLLM 0.32.0's OpenAI server; did you mean max_loras?\n" in proc.stderr
    assert f"  {FIELD}.max_loras: argument --max-loras: invalid int value: 'many'\n" in proc.stderr


def test_hbmserve_up_and_deploy_check_before_starting_or_connecting(tmp_path, monkeypatch):
    from hbmserve.cli.serve import register
    from hbmserve.cluster import local_head as lh, ray_cluster as rc

    def no_ray(*_a, **_k):
        raise AssertionError("Ray touched before the config was checked")

    for module, name in ((lh, "local_head_running"), (lh, "start_local_head"), (rc, "connect"), (rc, "deploy")):
        monkeypatch.setattr(module, name, no_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    app = typer.Typer()
    register(app)
    cfg = _config_file(tmp_path, {"load_format": "bogus"})
    for cmd in (["up", str(cfg)], ["deploy", str(cfg)]):
        result = CliRunner().invoke(app, cmd)
        assert result.exit_code == 2, result.output
        assert f"{FIELD}.load_format: Load format `bogus` is not supported" in result.output


def test_a_models_adapters_reach_vllm_as_its_lora_arguments(parser):
    model = ModelSpec.model_validate({
        "name": "m", "source": "/models/m", "engine": "vllm-gpu",
        "adapters": [{"name": "sql", "source": "/cache/sql", "max_rank": 8}, {"name": "chat", "source": "/cache/chat"}],
        "lora": {"max_loras": 2, "max_lora_rank": 16, "max_cpu_loras": 6}})
    args = parse_launch(vllm_launch(model, "h", 1))
    assert (args.enable_lora, args.max_loras, args.max_lora_rank, args.max_cpu_loras) == (True, 2, 16, 6)
    assert not args.lora_modules, "none at start: the replica registers each on demand (replica_middleware.py AdapterRegistry)"
    assert not parse_launch(vllm_launch(_spec({}).models[0], "h", 1)).enable_lora  # no adapters, no LoRA


@pytest.mark.parametrize("fields, message", [
    ({"adapters": [{"name": "m", "source": "/a"}]}, "models.0.adapters.0.name: 'm' is already the name of a model"),
    ({"adapters": [{"name": "a", "source": "/a", "max_rank": 32}]},
     "adapters.0.max_rank: a has rank 32, above lora.max_lora_rank (16)"),
    ({"adapters": [{"name": "a", "source": "/a"}, {"name": "a", "source": "/b"}]},
     "adapters: names must be unique; repeated: a"),
    ({"adapters": [{"name": "a", "source": "/a"}], "engine_settings": {"vllm_args": {"max_loras": 2}}},
     "engine_settings.vllm_args.max_loras: set by lora.max_loras when the model declares adapters"),
    ({"lora": {"max_lora_rank": 12}}, "models.0.lora.max_lora_rank: Input should be 1, 8, 16"),
    ({"lora": {"max_loras": 4, "max_cpu_loras": 2}}, "max_cpu_loras (2) must be >= max_loras (4)"),
    ({"adapters": [{"name": "a", "source": ""}]}, "models.0.adapters.0.source"),
])
def test_adapter_config_errors_name_the_field(fields, message):
    with pytest.raises(ConfigError) as err:
        parse_cluster_spec({"models": [{"name": "m", "source": "/models/m", **fields}]}, "c.yaml")
    assert message in str(err.value)
