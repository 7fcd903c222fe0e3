"""GSM8K-style scoring of a rollout: the answer after ``#### ``, compared with the ground truth.

:func:`gsm8k_score` is verl's ``verl.utils.reward_score.gsm8k.compute_score``, same results: the
*last* ``#### <number>`` in the last 300 characters, commas and ``$`` removed, compared as a
**string**. That is why the seed's sample scores 0: its answer is ``#### 220000.0`` and GSM8K's is
``220000``. ``numeric=True`` compares the numbers instead (``220000.0`` == ``220000``).
"""

from __future__ import annotations

import math
import re

#: verl matches only the end of long answers (the final answer is there, and the regex is faster).
SOLUTION_CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")


def extract_gsm8k_answer(solution_str: str, method: str = "strict") -> str | None:
    """The answer a GSM8K scorer reads from ``solution_str`` (None when there is none)."""
    if method not in ("strict", "flexible"):
        raise ValueError("method must be 'strict' or 'flexible'")
    if len(solution_str) > SOLUTION_CLIP_CHARS:
        solution_str = solution_str[-SOLUTION_CLIP_CHARS:]
    if method == "strict":
        found: list[str] = _STRICT.findall(solution_str)
        return found[-1].replace(",", "").replace("$", "") if found else None
    candidates: list[str] = _FLEXIBLE.findall(solution_str)
    for candidate in reversed(candidates):
        if candidate not in ("", "."):
            return candidate
    return None


def _as_number(text: str) -> float | None:
    try:
        value = float(text.replace(",", "").rstrip("."))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def gsm8k_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
    *,
    numeric: bool = False,
) -> float:
    """``score`` for a right answer, ``format_score`` for a wrong one, 0 without an answer."""
    answer = extract_gsm8k_answer(solution_str, method)
    if answer is None:
        return 0.0
    if answer == ground_truth:
        return score
    if numeric:
        got, want = _as_number(answer), _as_number(str(ground_truth))
        if got is not None and want is not None and math.isclose(got, want, rel_tol=0, abs_tol=1e-9):
            return score
    return format_score


def gsm8k_numeric_score(solution_str: str, ground_truth: str) -> float:
    """:func:`gsm8k_score` comparing numbers (``#### 220000.0`` is right for ``220000``)."""
    return gsm8k_score(solution_str, ground_truth, numeric=True)


def gsm8k_ground_truth(answer_field: str) -> str:
    """The ground truth of a GSM8K row's ``answer`` (the text after ``#### ``, commas removed)."""
    found = re.search(r"#### (\-?[0-9\.\,]+)", answer_field)
    if found is None:
        raise ValueError("no '#### <number>' in the answer")
    return found.group(1).replace(",", "")
