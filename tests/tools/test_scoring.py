"""The GSM8K scorer: verl's results, and why the seed's sample scores 0."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from mocksandbox.tools import RolloutScript, extract_gsm8k_answer, gsm8k_numeric_score, gsm8k_score
from mocksandbox.tools.scoring import gsm8k_ground_truth

CASES = [
    ("#### 72", "72"),
    ("so... #### 1,234", "1234"),
    ("#### $5", "5"),
    ("first #### 3 then #### 4", "4"),
    ("no answer here", "1"),
    ("#### 220000.0", "220000"),
    ("#### -7", "-7"),
    ("x" * 400 + "#### 9", "9"),
    ("#### 9" + "x" * 400, "9"),
    ("####42", "42"),
]


def _verl_gsm8k() -> ModuleType:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (make test puts it in .venv/test-vendor)")
    path = Path(next(iter(spec.submodule_search_locations))) / "utils" / "reward_score" / "gsm8k.py"
    if not path.exists():
        pytest.skip("this verl has no gsm8k.py")
    module_spec = importlib.util.spec_from_file_location("_verl_gsm8k", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("solution", "truth"), CASES)
@pytest.mark.parametrize("method", ["strict", "flexible"])
def test_same_scores_as_verl(solution: str, truth: str, method: str) -> None:
    verl = _verl_gsm8k()
    assert gsm8k_score(solution, truth, method) == verl.compute_score(solution, truth, method)
    assert extract_gsm8k_answer(solution, method) == verl.extract_solution(solution, method)


def test_the_seed_sample_scores_zero_and_why(seed_script: RolloutScript) -> None:
    output = seed_script.expected["record"]["output"]
    assert extract_gsm8k_answer(output) == "220000.0"
    assert gsm8k_score(output, "220000") == 0 == seed_script.expected["score"]
    assert gsm8k_numeric_score(output, "220000") == 1.0  # right, as a number


def test_ground_truth_from_a_gsm8k_answer() -> None:
    assert gsm8k_ground_truth("10% of 200,000 is 20,000\n#### 220,000") == "220000"
    with pytest.raises(ValueError):
        gsm8k_ground_truth("no marker")
