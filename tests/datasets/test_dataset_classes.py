"""Every evaluation-class family over HTTP: a real server, real programs, small rows written here.

Each family gets a prompt check and an accepted and a rejected submission, from rows in its
SandboxFusion format (files in a temporary ``--datasets`` directory, or ``config.provided_data``).
Families whose toolchain the host lacks are skipped with the reason.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from mocksandbox.core import MockSandbox
from mocksandbox.serving.single import ServerThread
from mocksandbox.settings import Settings

NO_PROXY = {"http": "", "https": ""}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


TABLES: dict[str, list[dict[str, Any]]] = {
    "code_eval_mbxp_v1_en": [
        {
            "id": 1,
            "content": "Write add(a, b).",
            "labels": {"task_id": "mbxp/1", "programming_language": "python", "execution_language": "python"},
            "test": {"code": "#<INSERT>\n\nassert add(1, 2) == 3\n"},
        }
    ],
    "code_eval_aider_benchmark_v1": [
        {
            "id": 1,
            "content": "Implement twice.",
            "labels": {"reference": "def twice(x):\n    pass"},
            "test": {
                "code": "#<INSERT>\nimport test_twice\n",
                "asset": {"test_twice.py": b64("from __main__ import twice\nassert twice(2) == 4\n")},
            },
        }
    ],
    "code_eval_mhpp": [
        {
            "id": 1,
            "content": 'def inc(x):\n    """Add one."""\n',
            "test": "assert inc(1) == 2\nassert inc(0) == 1",
            "labels": {"difficulty_type": "Shortcut"},
        }
    ],
    "code_eval_cruxeval": [
        {"id": "sample_0", "code": "def f(x):\n    return x * 2", "input": "3", "output": "6"}
    ],
    "code_eval_repobench_c_python_sampled": [
        {
            "id": 1,
            "file_path": "a.py",
            "context": "",
            "import_statement": "",
            "code": "",
            "prompt": "x = ",
            "next_line": "y = compute(1)",
        }
    ],
    "code_eval_live_code_bench_v1": [
        {
            "id": 1,
            "content": "Add two numbers.",
            "labels": {},
            "test": {"input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})},
        }
    ],
    "code_eval_ncb_python_en": [
        {
            "id": 1,
            "content": "Write sq.",
            "labels": {},
            "test": {"code": "def test_sq():\n    assert sq(3) == 9\n"},
        }
    ],
    "code_eval_verilogeval_human": [
        {
            "id": 0,
            "task_id": "wire",
            "code_preface": "module top_module(input a, output b);\n",
            "description": "Connect a to b.",
            "canonical_solution": "assign b = a;\nendmodule",
            "labels": {
                "system_prompt": "You write Verilog.",
                "question_prompt": "Complete:",
                "fewshot": "Q: ...",
            },
            "test": 'module tb();\nreg a; wire b;\ntop_module dut(.a(a), .b(b));\ninitial begin a = 1; #1; if (b !== 1) $fatal(1, "bad"); $finish; end\nendmodule\n',
        }
    ],
}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("datasets")
    for table, rows in TABLES.items():
        (directory / f"{table}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    box = MockSandbox.create(
        Settings(pod_name=None, datasets_dirs=[str(directory)], dataset_assets_dir=str(directory))
    )
    server = ServerThread(box, "127.0.0.1", 0).start()
    yield server.url
    server.stop()
    box.close()


def post(url: str, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = requests.post(f"{url}{path}", json=body, proxies=NO_PROXY, timeout=120)
    assert response.status_code == status, response.text
    return response.json()


def submit(url: str, dataset: str, row_id: Any, completion: str, **config: Any) -> dict[str, Any]:
    return post(
        url, "/submit", {"dataset": dataset, "id": row_id, "completion": completion, "config": config}
    )


def test_mbpp_and_humaneval_families(url: str) -> None:
    row = {
        "id": 1,
        "content": "Write add.",
        "labels": {"test_setup_code": ""},
        "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
    }
    prompt = post(
        url,
        "/get_prompt_by_id",
        {"dataset": "mbpp", "id": 1, "config": {"provided_data": row, "is_fewshot": True}},
    )
    assert prompt["prompt"].count("[BEGIN]") == 4 and prompt["prompt"].endswith("[BEGIN]\n")
    assert submit(url, "mbpp", 1, "```python\ndef add(a, b):\n    return a + b\n```", provided_data=row)[
        "accepted"
    ]
    assert not submit(url, "mbpp", 1, "def add(a, b):\n    return a - b\n", provided_data=row)["accepted"]
    human = {
        "task_id": "H/0",
        "prompt": "def inc(x):\n",
        "test": "def check(f):\n    assert f(1) == 2\n",
        "entry_point": "inc",
    }
    assert (
        post(url, "/get_prompts", {"dataset": "humaneval_python", "config": {"provided_data": [human]}})[0][
            "id"
        ]
        == "H/0"
    )
    passed = submit(url, "humaneval_python", 0, "    return x + 1\n\nprint('trailing')", provided_data=human)
    assert passed["accepted"] and passed["extracted_code"] == "    return x + 1\n"
    assert not submit(url, "humaneval_python", 0, "    return x\n", provided_data=human)["accepted"]


def test_online_judge_stops_at_the_first_failing_case(url: str) -> None:
    cases = [{"input": {"stdin": f"{n}\n"}, "output": {"stdout": f"{n}\n"}} for n in range(6)]
    cases[1]["output"]["stdout"] = "wrong\n"
    row = {"id": 1, "content": "Echo.", "labels": {}, "test": cases}
    echo = "```python\nprint(input())\n```"
    first = submit(url, "code_contests", 1, echo, language="python", provided_data=row)
    assert [t["passed"] for t in first["tests"]] == [True, False] and not first["accepted"]
    every = submit(
        url, "code_contests", 1, echo, language="python", provided_data=row, extra={"run_all_cases": True}
    )
    assert [t["passed"] for t in every["tests"]] == [True, False, True, True, True, True]
    missing = post(
        url, "/submit", {"dataset": "code_contests", "id": 1, "completion": echo, "config": {}}, status=400
    )
    assert missing == {"detail": "config.language field must exist for CommonOJDataset, got None"}


def test_mbxp_family(url: str) -> None:
    assert (
        post(url, "/get_prompt_by_id", {"dataset": "mbxp_v1_en", "id": 1, "config": {}})["prompt"]
        == "Write add(a, b)."
    )
    good = submit(url, "mbxp_v1_en", 1, "```python\ndef add(a, b):\n    return a + b\n```")
    assert good["accepted"] and good["extracted_type"] == "fenced"
    hack = submit(url, "mbxp_v1_en", 1, "```python\nimport sys\ndef add(a, b):\n    sys.exit(0)\n```")
    assert not hack["accepted"]  # exit(0) is the anti-hack rule's


def test_single_program_families(url: str) -> None:
    aider = submit(url, "aider_benchmark_v1", 1, "```python\ndef twice(x):\n    return 2 * x\n```")
    assert aider["accepted"] and "assert twice(2) == 4" in aider["test_code"]
    assert not submit(url, "aider_benchmark_v1", 1, "```python\ndef twice(x):\n    return x\n```")["accepted"]
    assert post(url, "/get_prompt_by_id", {"dataset": "mhpp", "id": 1, "config": {}})["prompt"].endswith(
        'e.g. assert inc(1) == 2 """'
    )
    assert submit(url, "mhpp", 1, "```python\ndef inc(x):\n    return x + 1\n```")["accepted"]
    function = post(url, "/get_metrics_function", {"dataset": "mhpp", "config": {}})["function"]
    assert "def get_metrics(results)" in function
    assert submit(url, "ncb_python_en", 1, "```python\ndef sq(x):\n    return x * x\n```")["accepted"]
    assert not submit(url, "ncb_python_en", 1, "```python\ndef sq(x):\n    return x\n```")["accepted"]


def test_prediction_families(url: str) -> None:
    prompts = post(url, "/get_prompts", {"dataset": "cruxeval", "config": {}})
    assert [p["labels"]["mode"] for p in prompts] == ["input", "output"]
    assert submit(
        url, "cruxeval", "sample_0", "[ANSWER]\nassert f(3) == 6\n[/ANSWER]", extra={"mode": "output"}
    )["accepted"]
    assert not submit(url, "cruxeval", "sample_0", "[ANSWER]7[/ANSWER]", extra={"mode": "output"})["accepted"]
    assert submit(url, "repobench_c_python", 1, "# a comment\ny = compute(1)\n")["accepted"]
    assert not submit(url, "repobench_c_python", 1, "y = compute(2)")["accepted"]
    # No tokenizer in this test's assets dir: RepoBench-P prompts are SandboxFusion's 500.
    failed = post(
        url,
        "/get_prompts",
        {
            "dataset": "repobench_p_python",
            "config": {
                "provided_data": [
                    {
                        "id": 1,
                        "file_path": "a",
                        "context": "[]",
                        "import_statement": "",
                        "code": "",
                        "gold_snippet_index": 0,
                        "next_line": "",
                    }
                ]
            },
        },
        status=500,
    )
    assert failed["detail"].startswith("Incorrect path_or_model_id: 'assets/tokenizer/gpt2'")


def test_live_code_bench(url: str) -> None:
    good = submit(
        url, "live_code_bench_v1", 1, "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    )
    assert good["accepted"], good["tests"][0]["exec_info"]
    assert not submit(url, "live_code_bench_v1", 1, "```python\nprint(0)\n```")["accepted"]


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="iverilog is not installed")
def test_verilog(url: str) -> None:
    prompt = post(
        url, "/get_prompt_by_id", {"dataset": "verilogeval_human", "id": 0, "config": {"is_fewshot": True}}
    )["prompt"]
    assert prompt.startswith("Q: ...\n\n----------------\n\nQuestion:\nYou write Verilog.")
    assert submit(url, "verilogeval_human", 0, "```verilog\n    assign b = a;\nendmodule\n```")["accepted"]
    assert not submit(url, "verilogeval_human", 0, "```verilog\n    assign b = 0;\nendmodule\n```")[
        "accepted"
    ]


def test_autoeval_with_provided_data(url: str) -> None:
    row = {
        "id": 1,
        "content": "Write double.",
        "labels": {"programming_language": "python", "prompt_template": "Q: $question ($locale)"},
        "test": {"code": "#<INSERT>\nassert double(2) == 4\n"},
    }
    prompts = post(
        url,
        "/get_prompts",
        {
            "dataset": "x",
            "config": {"dataset_type": "AutoEvalDataset", "locale": "en", "provided_data": [row, row]},
        },
    )
    assert [p["prompt"] for p in prompts] == ["Q: Write double. (en)"] * 2
    config = {"dataset_type": "AutoEvalDataset", "provided_data": row, "extra": {"append_flag": True}}
    answer = "```python\ndef double(x):\n    return 2 * x\n```"
    assert post(url, "/submit", {"dataset": "x", "id": 1, "completion": answer, "config": config})["accepted"]


def test_minif2f_without_lean_is_not_accepted(url: str) -> None:
    row = {"id": "mathd_1", "content": "theorem mathd_1 : 1 + 1 = 2 := by\n  sorry", "labels": {}}
    prompt = post(
        url,
        "/get_prompt_by_id",
        {"dataset": "minif2f_lean4_test", "id": "mathd_1", "config": {"provided_data": row, "locale": "en"}},
    )
    assert prompt["prompt"].startswith(
        "Please finish the following theorem in Lean4:\n\n```lean\ntheorem mathd_1"
    )
    if shutil.which("lake") is None:
        result = submit(
            url,
            "minif2f_lean4_test",
            "mathd_1",
            "```lean\ntheorem mathd_1 : 1 + 1 = 2 := by norm_num\n```",
            provided_data=row,
        )
        assert not result["accepted"]
        assert result["full_code"].startswith("import Mathlib.Algebra.Algebra.Basic")


def test_evoeval_metrics_function_runs(url: str) -> None:
    source = post(url, "/get_metrics_function", {"dataset": "evoeval", "config": {}})["function"]

    class Result:
        def __init__(self, task: str, accepted: bool) -> None:
            self.id, self.accepted = task, accepted

    names: dict[str, Any] = {"repeats": 2, "k_targets": [1, 2]}
    exec(source, names)
    metrics = names["get_metrics"](
        [Result("EvoEval_tool_EvoEval/1", True), Result("EvoEval_tool_EvoEval/1", False)]
    )
    assert metrics == {"tool/Pass@k=1": 0.5, "tool/Pass@k=2": 1.0}
    assert post(url, "/get_metrics", {"dataset": "evoeval", "config": {}, "results": []}) == {}


def test_unknown_dataset_answers(url: str) -> None:
    assert post(url, "/get_prompts", {"dataset": "nope", "config": {}}, status=400) == {
        "detail": "no eval class found for dataset nope"
    }
    assert post(
        url, "/list_ids", {"dataset": "mbpp_typo", "config": {"dataset_type": "Nope"}}, status=400
    ) == {"detail": "eval class Nope not found"}
    missing = post(url, "/get_prompts", {"dataset": "palmath", "config": {}}, status=500)
    assert missing["detail"].endswith("'NoneType' object has no attribute 'fetch_all'")


def test_sample_datasets_stay_served(url: str) -> None:
    listed = requests.get(f"{url}/list_datasets", proxies=NO_PROXY, timeout=10).json()
    assert listed[-2:] == ["code_contests_sample", "humaneval_sample"]
    assert Path(__file__).exists()
