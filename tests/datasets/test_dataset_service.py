"""The dataset service over the shipped samples, evaluating with the real engine (no HTTP).

Every sample problem's reference solution must be accepted, and a wrong one rejected: the samples
are only useful if they are right.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from mocksandbox.datasets import DatasetHTTPError, DatasetService
from mocksandbox.datasets.models import (
    GetMetricsFunctionRequest,
    GetMetricsRequest,
    GetPromptByIdRequest,
    GetPromptsRequest,
    SubmitRequest,
    TestConfig,
)
from mocksandbox.execution.engine import ExecutionEngine, create_engine
from mocksandbox.settings import Settings


@pytest.fixture(scope="module")
def engine() -> Iterator[ExecutionEngine]:
    engine, confinement, launcher = create_engine(Settings(pod_name=None))
    yield engine
    launcher.close()
    confinement.close()


@pytest.fixture(scope="module")
def service(engine: ExecutionEngine) -> DatasetService:
    return DatasetService.from_settings(Settings(pod_name=None), engine)


def rows(service: DatasetService, dataset: str) -> list[dict[str, Any]]:
    """A sample table's rows with their JSON columns parsed."""
    found = service.registry.tables.rows(TestConfig(), f"code_eval_{dataset}", None, 0, -1)
    for row in found:
        for key in ("labels", "test", "test_list"):
            if isinstance(row.get(key), str) and row[key][:1] in "[{":
                row[key] = json.loads(row[key])
    return found


def submit(service: DatasetService, dataset: str, row_id: Any, completion: str, **config: Any) -> Any:
    return service.submit(SubmitRequest(dataset=dataset, id=row_id, completion=completion, config=config))  # type: ignore[arg-type]


def test_samples_are_registered(service: DatasetService) -> None:
    listed = service.list_datasets()
    assert len(listed) == 55 and listed[:2] == ["aider_benchmark_v1", "code_contests"]
    assert listed[-2:] == ["code_contests_sample", "humaneval_sample"]  # recognised by their rows
    ids = service.list_ids(GetPromptsRequest.model_validate({"dataset": "mbpp", "config": {}}))
    assert ids == list(range(11, 31))


def test_every_mbpp_reference_solution_is_accepted(service: DatasetService) -> None:
    for row in rows(service, "mbpp"):
        result = submit(service, "mbpp", row["id"], f"```python\n{row['code']}\n```")
        assert result.accepted, (row["id"], result.tests[0].exec_info)


def test_every_humaneval_reference_solution_is_accepted(service: DatasetService) -> None:
    for row in rows(service, "humaneval_sample"):
        result = submit(
            service, "humaneval_sample", row["id"], row["canonical_solution"] + "\n\nprint('extra')\n"
        )
        assert result.accepted, (row["id"], result.tests[0].exec_info)
        # Free-form answers are taken whole only for SandboxFusion's own ids (humaneval_python, ...);
        # other ids cut them at the first unindented line after the first, imports included.
        freeform = f"```python\n{row['prompt']}{row['canonical_solution']}```"
        extra = {"is_freeform": True}
        assert submit(
            service, "humaneval_python", row["id"], freeform, extra=extra, provided_data=row
        ).accepted


def test_every_judge_reference_solution_is_accepted(service: DatasetService) -> None:
    for row in rows(service, "code_contests_sample"):
        result = submit(
            service,
            "code_contests_sample",
            row["id"],
            f"```python\n{row['canonical_solution']}```",
            language="python",
        )
        assert result.accepted, (row["id"], [t.exec_info for t in result.tests])
        assert len(result.tests) == len(row["test"])


def test_wrong_answers_are_rejected(service: DatasetService) -> None:
    wrong = submit(service, "mbpp", 12, "```python\ndef sort_matrix(M):\n    return M\n```")
    assert not wrong.accepted
    run_result = wrong.tests[0].exec_info.run_result
    assert run_result is not None and "AssertionError" in (run_result.stderr or "")
    assert not submit(service, "humaneval_sample", 0, "    return value\n").accepted
    judge = submit(service, "code_contests_sample", 5, "```python\nprint(input())\n```", language="python")
    assert [t.passed for t in judge.tests] == [False]  # stops at the first failing case


def test_prompts(service: DatasetService) -> None:
    prompts = service.get_prompts(
        GetPromptsRequest.model_validate(
            {"dataset": "code_contests_sample", "config": {"language": "python"}, "limit": 2}
        )
    )
    assert [p.id for p in prompts] == [1, 2]
    by_id = service.get_prompt_by_id(
        GetPromptByIdRequest.model_validate({"dataset": "humaneval_sample", "config": {}, "id": 2})
    )
    assert isinstance(by_id.prompt, str) and by_id.prompt.startswith("def digit_sum(n: int) -> int:")
    assert by_id.labels["entry_point"] == "digit_sum"


def test_metrics(service: DatasetService) -> None:
    result = submit(service, "mbpp", 17, "```python\ndef triangular(n):\n    return n * (n + 1) // 2\n```")
    request = GetMetricsRequest.model_validate(
        {"dataset": "mbpp", "config": {}, "results": [result.model_dump()]}
    )
    assert service.get_metrics(request) == {}
    function = service.get_metrics_function(
        GetMetricsFunctionRequest.model_validate({"dataset": "mbpp", "config": {}})
    )
    assert function.function is None


def test_missing_row_is_500_with_traceback(service: DatasetService) -> None:
    with pytest.raises(DatasetHTTPError) as info:
        submit(service, "mbpp", 99999, "x")
    assert (info.value.status, info.value.detail) == (500, "'NoneType' object is not iterable")
    assert info.value.traceback_lines is not None
    assert info.value.traceback_lines[0] == "Traceback (most recent call last):"
    with pytest.raises(DatasetHTTPError, match="not iterable"):
        service.get_prompt_by_id(
            GetPromptByIdRequest.model_validate({"dataset": "mbpp", "config": {}, "id": 1})
        )


def test_row_without_a_needed_column_is_500_with_traceback(service: DatasetService) -> None:
    with pytest.raises(DatasetHTTPError) as info:
        submit(service, "mbpp", 1, "x", provided_data={"id": 1, "content": "no tests"})
    assert info.value.status == 500
    assert info.value.detail == "'labels'"
    assert info.value.traceback_lines is not None and "KeyError: 'labels'" in info.value.traceback_lines


def test_custom_extract_logic_errors_are_500(service: DatasetService) -> None:
    with pytest.raises(DatasetHTTPError) as info:
        submit(
            service,
            "code_contests_sample",
            1,
            "x",
            language="python",
            custom_extract_logic="raise ValueError('nope')",
        )
    assert (info.value.status, info.value.detail) == (500, "nope")
    assert info.value.traceback_lines is not None and any(
        "ValueError: nope" in line for line in info.value.traceback_lines
    )


def test_custom_extract_logic_picks_the_code(service: DatasetService) -> None:
    logic = (
        "submit_code_blocks([CodeBlock(priority=99, language='python', code='print(' + completion + ')')])"
    )
    result = submit(
        service,
        "code_contests_sample",
        5,
        "'answers mock the'",
        language="python",
        custom_extract_logic=logic,
    )
    assert result.extracted_code == "print('answers mock the')"
    assert [t.passed for t in result.tests] == [True, False]


def test_datasets_inside_a_sandboxfusion_checkout_find_its_assets(
    tmp_path: Any, engine: ExecutionEngine
) -> None:
    """``--datasets <checkout>/sandbox/tests/datasets/samples`` finds ``<checkout>/assets`` as
    SandboxFusion does; ``--dataset-assets`` still wins; elsewhere there are none."""
    from mocksandbox.datasets.service import sandboxfusion_assets

    checkout = tmp_path / "SandboxFusion"
    samples = checkout / "sandbox" / "tests" / "datasets" / "samples"
    samples.mkdir(parents=True)
    (checkout / "assets" / "cruxeval_x_utils").mkdir(parents=True)
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    assert sandboxfusion_assets([str(samples)]) == str(checkout / "assets")
    assert sandboxfusion_assets([str(elsewhere), str(samples)]) == str(checkout / "assets")
    assert sandboxfusion_assets([str(elsewhere)]) is None
    found = DatasetService.from_settings(
        Settings(datasets_dirs=[str(samples)], sample_datasets=False), engine
    )
    assert found.assets_dir == str(checkout / "assets")
    assert any("from the SandboxFusion checkout" in note for note in found.startup_notes())
    given = Settings(datasets_dirs=[str(samples)], sample_datasets=False, dataset_assets_dir=str(elsewhere))
    assert DatasetService.from_settings(given, engine).assets_dir == str(elsewhere)
