"""Fleetdeck's copy of serve.llm's names and defaults, checked against the installed Ray 2.60 source.

`ray.serve.llm` cannot be imported here (it needs pyarrow, which Fleetdeck does not install), so the source
files are parsed instead of imported.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from apps.llm import accelerators, recognise

RAY = Path(importlib.util.find_spec("ray").submodule_search_locations[0])
LLM = RAY / "llm" / "_internal" / "serve"


def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _class_fields(path: Path, name: str) -> set[str]:
    (cls,) = [n for n in _module(path).body if isinstance(n, ast.ClassDef) and n.name == name]
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return {n for n in names if not n.startswith("_")}  # pydantic's private attributes are not fields


def _getenv_default(path: Path, name: str) -> str:
    """The default of `NAME = <conversion>(os.getenv("...", <default>))` in a constants module."""
    for node in _module(path).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            (getenv,) = [
                n for n in ast.walk(node.value) if isinstance(n, ast.Call) and ast.unparse(n.func) == "os.getenv"
            ]
            return ast.unparse(getenv.args[1])
    raise AssertionError(f"{name} not in {path}")


def test_llm_config_fields():
    path = LLM / "core" / "configs" / "llm_config.py"
    assert _class_fields(path, "LLMConfig") == recognise.LLM_CONFIG_FIELDS
    assert _class_fields(path, "ModelLoadingConfig") == recognise.MODEL_LOADING_CONFIG_FIELDS


def test_serving_args_fields():
    assert _class_fields(LLM / "core" / "ingress" / "builder.py", "LLMServingArgs") == {
        "llm_configs",
        "ingress_cls_config",
        "ingress_deployment_config",
    }
    assert "llm_config" in _class_fields(
        LLM / "serving_patterns" / "data_parallel" / "builder.py", "DPOpenAiServingArgs"
    )
    pd = _class_fields(LLM / "serving_patterns" / "prefill_decode" / "builder.py", "PDServingArgs")
    assert {"prefill_config", "decode_config"} <= pd


def test_builders_are_the_public_ones():
    functions = {n.name for n in _module(RAY / "serve" / "llm" / "__init__.py").body if isinstance(n, ast.FunctionDef)}
    assert set(recognise.BUILDERS) <= functions


def test_serve_llm_defaults():
    constants = LLM / "constants.py"
    defaults = {
        "max_ongoing_requests": eval(_getenv_default(constants, "DEFAULT_MAX_ONGOING_REQUESTS")),
        "health_check_period_s": eval(_getenv_default(constants, "DEFAULT_HEALTH_CHECK_PERIOD_S")),
        "health_check_timeout_s": eval(_getenv_default(constants, "DEFAULT_HEALTH_CHECK_TIMEOUT_S")),
        "target_ongoing_requests": eval(_getenv_default(constants, "DEFAULT_MAX_TARGET_ONGOING_REQUESTS")),
    }
    assert {k: int(v) for k, v in defaults.items()} == recognise.SERVE_LLM_DEFAULTS
    builder = (LLM / "core" / "server" / "builder.py").read_text()
    assert '"max_ongoing_requests": DEFAULT_MAX_ONGOING_REQUESTS' in builder
    assert '"health_check_timeout_s": DEFAULT_HEALTH_CHECK_TIMEOUT_S' in builder
    assert '"target_ongoing_requests": DEFAULT_MAX_TARGET_ONGOING_REQUESTS' in builder


def test_deployment_names():
    builder = (LLM / "core" / "server" / "builder.py").read_text()
    assert 'return llm_config.model_id.replace("/", "--").replace(".", "_")' in builder
    assert 'name_prefix = name_prefix or f"{deployment_cls.__name__}:"' in builder
    assert recognise.server_deployment_name("Qwen/Qwen2.5-0.5B-Instruct") == "LLMServer:Qwen--Qwen2_5-0_5B-Instruct"
    pd = (LLM / "serving_patterns" / "prefill_decode" / "builder.py").read_text()
    assert 'name_prefix="Prefill:"' in pd and 'name_prefix="Decode:"' in pd
    server_classes = {
        n.name
        for p in LLM.rglob("*.py")
        for n in _module(p).body
        if isinstance(n, ast.ClassDef) and n.name.endswith("Server")
    }
    assert {"LLMServer", "DPServer"} <= server_classes
    ingress_classes = {
        n.name for n in _module(LLM / "core" / "ingress" / "ingress.py").body if isinstance(n, ast.ClassDef)
    }
    router_classes = {
        n.name for n in _module(LLM / "core" / "ingress" / "router.py").body if isinstance(n, ast.ClassDef)
    }
    assert ingress_classes | router_classes >= recognise.INGRESS_NAMES


def test_engine_kwargs_are_split_between_frontend_and_engine_args():
    source = (LLM / "engines" / "vllm" / "vllm_models.py").read_text()
    assert "from vllm.entrypoints.launchers.cli_args import FrontendArgs" in source
    assert 'raise ValueError(f"Unknown engine argument: {key}")' in source


def test_known_accelerators_are_ray_names():
    module = _module(RAY / "util" / "accelerators" / "accelerators.py")
    names = {n.value.value for n in module.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}
    assert set(accelerators.KNOWN_ACCELERATORS) <= names
