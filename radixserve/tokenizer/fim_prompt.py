"""The token ids of a fill-in-the-middle prompt: the code before and after the cursor around
the model's FIM tokens (`fim.FimTokens`), the special tokens put in by id.

Two layouts:

* plain (``/v1/completions`` and Ollama's ``/api/generate`` with ``suffix``, as Ollama's
  Qwen2.5-Coder template writes it)::

      [bos] <PRE> prefix <SUF> suffix <MID>

* repository-level (``/infill``), as llama.cpp's server builds it (``format_prompt_infill``,
  after the Qwen2.5-Coder report, arXiv:2409.12186)::

      [<REPO> myproject\\n] (<SEP> filename\\n chunk)... [<SEP> filename\\n]
      [bos] <PRE> prefix prompt <SUF> suffix <MID>

  where a model without a file separator gets ``\\n\\n--- snippet ---\\n\\n`` before each chunk,
  and the parts are cut to a budget (`InfillBudget`).

Models that read the suffix first (Codestral) get ``<SUF> suffix <PRE> prefix``, and no
``<MID>`` where they have none. The code is tokenized as plain text (`Tokenizer.encode_text`):
a special token's spelling inside it stays text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixserve.tokenizer.tokenizer import Tokenizer

__all__ = ["InfillBudget", "fim_prompt_ids"]

_PROJECT = "myproject\n"  # llama.cpp's repository name (it takes none from the request)
_CURRENT_FILE = "filename\n"  # and the current file's
_SNIPPET = "\n\n--- snippet ---\n\n"  # a chunk's header without a file separator
_DEFAULT_BATCH = 2048  # llama.cpp's n_batch, which bounds prefix + suffix


@dataclass(frozen=True, slots=True)
class InfillBudget:
    """How much of each part ``/infill`` keeps, as llama.cpp's server: the last
    ``3/4 · batch`` prefix tokens, the first ``batch/4 - 2 - len(prompt)`` suffix tokens and
    the last ``n_ctx - batch - 2 · n_predict`` tokens of the extra context. ``batch`` is
    llama.cpp's 2048, or half the context where that is smaller (so that a short context
    still leaves room for the extra chunks)."""

    n_ctx: int
    n_predict: int  # -1: no limit

    @property
    def batch(self) -> int:
        return min(_DEFAULT_BATCH, self.n_ctx // 2)

    def prefix_take(self, num_prefix: int) -> int:
        return min(num_prefix, 3 * (self.batch // 4))

    def suffix_take(self, num_suffix: int, num_prompt: int) -> int:
        return min(num_suffix, max(0, self.batch // 4 - (2 + num_prompt)))

    def extra_take(self, num_extra: int) -> int:
        return min(max(0, self.n_ctx - self.batch - 2 * self.n_predict), num_extra)


def _repository_context(tokenizer: Tokenizer, chunks: Sequence[tuple[str, str]]) -> list[int]:
    """The extra context of the repository-level layout; ``chunks``: (filename, text)."""
    fim, encode = tokenizer.require_fim(), tokenizer.encode_text
    ids: list[int] = []
    if fim.repo is not None:
        ids += [fim.repo, *encode(_PROJECT)]
    for filename, text in chunks:
        if fim.file_sep is not None:
            ids += [fim.file_sep, *encode(filename + "\n")]
        else:
            ids += encode(_SNIPPET)
        ids += encode(text)
    if fim.file_sep is not None:
        ids += [fim.file_sep, *encode(_CURRENT_FILE)]
    return ids


def fim_prompt_ids(tokenizer: Tokenizer, prefix: str, suffix: str, *,
                   prompt_ids: Sequence[int] = (),
                   extra: Sequence[tuple[str, str]] | None = None,
                   budget: InfillBudget | None = None) -> list[int]:
    """The FIM prompt of ``prefix`` and ``suffix`` (see the module docstring); ``prompt_ids``
    go after the prefix (the start of the middle, llama.cpp's ``prompt``). ``extra``
    (filename, text) chunks: the repository-level layout (an empty list still names the
    project and file); None: the plain one. ``budget``: cut the parts to it (``/infill``).
    ValueError naming what is missing where the model has no FIM tokens."""
    fim = tokenizer.require_fim()
    prefix_ids = tokenizer.encode_text(prefix)
    suffix_ids = tokenizer.encode_text(suffix)
    extra_ids = [] if extra is None else _repository_context(tokenizer, extra)
    if budget is not None:
        take = budget.prefix_take(len(prefix_ids))
        prefix_ids = prefix_ids[len(prefix_ids) - take:]
        suffix_ids = suffix_ids[:budget.suffix_take(len(suffix_ids), len(prompt_ids))]
        extra_ids = extra_ids[len(extra_ids) - budget.extra_take(len(extra_ids)):]
    before = [fim.prefix, *prefix_ids, *prompt_ids]
    after = [fim.suffix, *suffix_ids]
    if fim.is_suffix_first:
        before, after = after, before
    middle = [] if fim.middle is None else [fim.middle]
    return [*extra_ids, *tokenizer.bos_prefix, *before, *after, *middle]
