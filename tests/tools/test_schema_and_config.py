"""The seed's tool schema, and tools registered from a verl-style YAML config (test_tools_registration)."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from mocksandbox.tools import (
    CODE_INTERPRETER_SCHEMA,
    CodeInterpreterTool,
    OpenAIFunctionParametersSchema,
    OpenAIFunctionPropertySchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
    RolloutScript,
    ToolConfigError,
    build_tools,
    code_interpreter_schema,
    load_tool_config,
)

VERL_STYLE_CONFIG = """\
tools:
  - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
    config:
      sandbox_fusion_url: "https://xxx.apigateway-cn-beijing.volceapi.com/run_code"
      num_workers: 6
      enable_global_rate_limit: true
      rate_limit: 3
      default_timeout: 12
      default_language: "python"
    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "The code to execute."
          required: ["code"]
"""


def test_schema_is_the_seeds_tools_line(seed_script: RolloutScript) -> None:
    # The seed's <tools> block holds the schema as one JSON line: ours serialises to that line.
    record_input = seed_script.expected["record"]["input"]
    line = record_input.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert CODE_INTERPRETER_SCHEMA.to_json() == line
    assert json.loads(line)["function"]["parameters"]["properties"]["code"]["enum"] is None


def test_schema_built_as_the_seed_builds_it() -> None:
    assert code_interpreter_schema() == OpenAIFunctionToolSchema(
        type="function",
        function=OpenAIFunctionSchema(
            name="code_interpreter",
            description="A tool for executing code.",
            parameters=OpenAIFunctionParametersSchema(
                type="object",
                properties={
                    "code": OpenAIFunctionPropertySchema(
                        type="string", description="The code to execute.", enum=None
                    )
                },
                required=["code"],
            ),
            strict=False,
        ),
    )


def _verl_schemas() -> ModuleType:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (make test puts it in .venv/test-vendor)")
    path = Path(next(iter(spec.submodule_search_locations))) / "tools" / "schemas.py"
    if not path.exists():
        pytest.skip("this verl has no verl/tools/schemas.py")
    module_spec = importlib.util.spec_from_file_location("_verl_tool_schemas", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except ImportError as exc:
        pytest.skip(f"verl's schemas.py needs more than pydantic here: {exc}")
    return module


def test_schema_serialises_as_verls_models() -> None:
    verl = _verl_schemas()
    theirs = verl.OpenAIFunctionToolSchema.model_validate(CODE_INTERPRETER_SCHEMA.model_dump())
    assert json.dumps(theirs.model_dump()) == CODE_INTERPRETER_SCHEMA.to_json()


def test_tools_registration(tmp_path: Path) -> None:
    path = tmp_path / "sandbox_fusion_tool_config.yaml"
    path.write_text(VERL_STYLE_CONFIG)
    specs = load_tool_config(path)
    assert [s.class_name for s in specs] == ["verl.tools.sandbox_fusion_tools.SandboxFusionTool"]
    with build_tools(path, {"rate_limiter_name": f"registration-{tmp_path.name}"}) as tools:
        assert len(tools.schemas) == 1
        assert "code_interpreter" in tools
        tool = tools["code_interpreter"]
        assert isinstance(tool, CodeInterpreterTool)
        # The schema from YAML omits enum; it is the seed's schema all the same.
        assert tool.get_openai_tool_schema() == CODE_INTERPRETER_SCHEMA
        cfg = tool.config
        assert (cfg.num_workers, cfg.rate_limit, cfg.default_timeout) == (6, 3, 12)
        assert (cfg.default_language, cfg.enable_global_rate_limit) == ("python", True)
        assert tool.url == "https://xxx.apigateway-cn-beijing.volceapi.com/run_code"
        assert tool.pool.limit == 3 and tool.pool.num_workers == 6


def test_shipped_tool_config_registers(monkeypatch: pytest.MonkeyPatch, rollout_fixtures: Path) -> None:
    # The README's config: no URL in the file, so it comes from $SANDBOX_FUSION_URL.
    monkeypatch.setenv("SANDBOX_FUSION_URL", "http://127.0.0.1:9/run_code")
    with build_tools(
        rollout_fixtures / "sandbox_fusion_tool_config.yaml", {"rate_limiter_name": "shipped"}
    ) as tools:
        assert list(tools) == ["code_interpreter"]
        assert tools["code_interpreter"].url == "http://127.0.0.1:9/run_code"


def test_seed_defaults_and_base_url(tmp_path: Path) -> None:
    tool = CodeInterpreterTool(
        {"sandbox_fusion_url": "http://127.0.0.1:8080", "rate_limiter_name": "defaults"}
    )
    try:
        cfg = tool.config
        assert (cfg.num_workers, cfg.rate_limit, cfg.default_timeout) == (10, 10, 30)
        assert (cfg.default_language, cfg.enable_global_rate_limit) == ("python", True)
        assert tool.url == "http://127.0.0.1:8080/run_code"  # a base URL gets /run_code
        assert tool.name == "code_interpreter"
    finally:
        tool.close()


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("tools: 3", "'tools' list"),
        ("tools:\n  - config: {}", "class_name"),
        ("tools:\n  - class_name: NoSuchTool", "not a known tool"),
        ("tools:\n  - class_name: json.JSONDecoder", "not a mocksandbox.tools.BaseTool"),
        ("tools:\n  - class_name: no.such.module.Tool", "cannot be imported"),
        (
            "tools:\n  - class_name: SandboxFusionTool\n    config: {sandbox_fusion_url: u, rate_limt: 3}",
            "rate_limt",
        ),
        (
            "tools:\n  - class_name: SandboxFusionTool\n    config: {sandbox_fusion_url: u, default_language: cobol}",
            "cobol",
        ),
        ("tools:\n  - class_name: SandboxFusionTool\n    tool_schema: {type: function}", "tool_schema"),
        ("tools: [", "not valid"),
    ],
)
def test_bad_configs_say_what_is_wrong(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent(yaml_text))
    with pytest.raises(ToolConfigError, match=message):
        build_tools(path)


def test_missing_url_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOX_FUSION_URL", raising=False)
    with pytest.raises(ToolConfigError, match="sandbox_fusion_url is not set"):
        CodeInterpreterTool({})
