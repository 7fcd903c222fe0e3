"""Tool-calling rollouts without a GPU: the seed's ``code_interpreter`` and a scripted driver.

=============================  =====================================================================
``code_interpreter_schema``    the seed's OpenAI function schema (``CODE_INTERPRETER_SCHEMA``)
``CodeInterpreterTool``        ``create / execute / calc_reward / release`` per ``instance_id``,
                               every call through the reference execution pool and limiter
``load_tool_config``,          verl-style YAML tool configs (``tools: [{class_name, config,
``build_tools``                tool_schema}]``) into a :class:`ToolRegistry`
``parse_tool_calls``,          Hermes/Qwen ``<tool_call>`` parsing, ``<tools>`` and
``ChatFormat``                 ``<tool_response>`` rendering
``RolloutDriver``              the multi-turn loop for scripted policies; batches run concurrently
``gsm8k_score``                verl's GSM8K scorer (``#### <answer>``)
=============================  =====================================================================

Example (against the mock, or any SandboxFusion URL)::

    from mocksandbox.tools import RolloutDriver

    with RolloutDriver.for_sandbox(url, {"rate_limit": 4}) as driver:
        request = driver.create_request(
            "What is 6 * 7?",
            ['<tool_call>\\n{"name": "code_interpreter", "arguments": {"code": "print(6*7)"}}\\n</tool_call>',
             "#### 42"],
            ground_truth="42",
        )
        [record] = driver.run_sync(request)   # record.tool_responses == ["42\\n"], record.score == 1.0
"""

from __future__ import annotations

from mocksandbox.tools.base import BaseTool, ToolResult, UnknownInstanceError
from mocksandbox.tools.client import (
    RunOutcome,
    SandboxAPIError,
    SandboxBadResponse,
    SandboxCall,
    SandboxConnectionError,
    SandboxHTTPError,
    SandboxNoAnswer,
    run_code_call,
)
from mocksandbox.tools.code_interpreter import CodeInterpreterTool
from mocksandbox.tools.config import (
    CodeInterpreterConfig,
    ToolConfigError,
    ToolRegistry,
    ToolSpec,
    build_tools,
    load_tool_config,
    parse_tool_config,
)
from mocksandbox.tools.hermes import (
    ChatFormat,
    Message,
    ParsedTurn,
    ToolCall,
    ToolCallError,
    ToolTurnStyle,
    format_tool_call,
    format_tool_response,
    parse_tool_calls,
    strip_special_tokens,
    tools_block,
)
from mocksandbox.tools.observation import ObservationKind
from mocksandbox.tools.rollout import (
    PolicyInput,
    RolloutDriver,
    RolloutRecord,
    RolloutRequest,
    RolloutScript,
    RolloutState,
    ScriptedPolicy,
    StopReason,
    ToolCallRecord,
    approx_token_count,
    dump_jsonl,
    load_jsonl,
)
from mocksandbox.tools.schema import (
    CODE_INTERPRETER_SCHEMA,
    OpenAIFunctionParametersSchema,
    OpenAIFunctionPropertySchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
    code_interpreter_schema,
)
from mocksandbox.tools.scoring import extract_gsm8k_answer, gsm8k_numeric_score, gsm8k_score

__all__ = [
    "CODE_INTERPRETER_SCHEMA",
    "BaseTool",
    "ChatFormat",
    "CodeInterpreterConfig",
    "CodeInterpreterTool",
    "Message",
    "ObservationKind",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolSchema",
    "ParsedTurn",
    "PolicyInput",
    "RolloutDriver",
    "RolloutRecord",
    "RolloutRequest",
    "RolloutScript",
    "RolloutState",
    "RunOutcome",
    "SandboxAPIError",
    "SandboxBadResponse",
    "SandboxCall",
    "SandboxConnectionError",
    "SandboxHTTPError",
    "SandboxNoAnswer",
    "ScriptedPolicy",
    "StopReason",
    "ToolCall",
    "ToolCallError",
    "ToolCallRecord",
    "ToolConfigError",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "ToolTurnStyle",
    "UnknownInstanceError",
    "approx_token_count",
    "build_tools",
    "code_interpreter_schema",
    "dump_jsonl",
    "extract_gsm8k_answer",
    "format_tool_call",
    "format_tool_response",
    "gsm8k_numeric_score",
    "gsm8k_score",
    "load_jsonl",
    "load_tool_config",
    "parse_tool_calls",
    "parse_tool_config",
    "run_code_call",
    "strip_special_tokens",
    "tools_block",
]
