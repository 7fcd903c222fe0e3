"""The GPT-2 tokenizer RepoBench-P counts prompt budgets with, when this host has one.

SandboxFusion loads ``assets/tokenizer/gpt2`` (a ``tokenizer.json``), relative to its working
directory, with ``transformers``; without it, every RepoBench-P prompt is a 500. The mock loads the
same file with the ``tokenizers`` package (the ``datasets`` extra) from ``--dataset-assets DIR``
(``DIR/tokenizer/gpt2``), else from ``assets/tokenizer/gpt2`` under the working directory as
SandboxFusion does, and answers SandboxFusion's 500 when either is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

#: Where SandboxFusion looks, relative to its working directory.
SANDBOXFUSION_TOKENIZER_PATH = "assets/tokenizer/gpt2"

#: SandboxFusion's error when the tokenizer directory is missing (transformers' wording).
MISSING_TOKENIZER = (
    f"Incorrect path_or_model_id: '{SANDBOXFUSION_TOKENIZER_PATH}'. Please provide either the path to a "
    "local folder or the repo_id of a model on the Hub."
)

# transformers' clean_up_tokenization, on by default for GPT-2's fast tokenizer.
_CLEANUPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class GPT2Tokenizer:
    """``tokenizer.json`` through the ``tokenizers`` package, decoding as transformers does."""

    def __init__(self, tokenizer_json: Path) -> None:
        from tokenizers import Tokenizer as _Tokenizer  # optional dependency: the datasets extra

        self._tokenizer = _Tokenizer.from_file(str(tokenizer_json))

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        text: str = self._tokenizer.decode(ids, skip_special_tokens=False)
        for before, after in _CLEANUPS:
            text = text.replace(before, after)
        return text


def find_gpt2_tokenizer(assets_dir: str | None) -> tuple[GPT2Tokenizer | None, str]:
    """The tokenizer, or ``None`` with the reason (for the start-up lines)."""
    base = Path(assets_dir) / "tokenizer" / "gpt2" if assets_dir else Path(SANDBOXFUSION_TOKENIZER_PATH)
    tokenizer_json = base / "tokenizer.json"
    if not tokenizer_json.is_file():
        return None, f"no GPT-2 tokenizer at {tokenizer_json}"
    try:
        return GPT2Tokenizer(tokenizer_json), f"GPT-2 tokenizer from {tokenizer_json}"
    except ImportError:
        return None, "the tokenizers package is not installed (pip install 'mocksandbox[datasets]')"
    except Exception as exc:  # a damaged file: say so at start-up rather than at each request
        return None, f"cannot load {tokenizer_json}: {exc}"
