"""llguidance's view of a radixserve `Tokenizer`: its token trie, the mask slices, and a way
to tokenize text. Both processes build one (the API process's spec check, the engine's
matchers).

llguidance can read a Hugging Face ``tokenizers`` JSON and build a second Rust tokenizer from
it. For a 152k vocabulary that takes about 1 CPU second and holds about 110 MB. Where our
tokenizer has a token → bytes table (byte-level BPE and SentencePiece vocabularies: the
detokenizer's), the view is built from that table instead: llguidance's trie and slices over
the same bytes, and our tokenizer called for the text it tokenizes. That is 0.4 CPU s and
about 55 MB (issue 63). The view is the same as the JSON one's: the bytes of every id, the
special ids (every added token llguidance's JSON reader calls special), the eos ids, and the
placeholder ids past the tokenizer's vocabulary. `tests/structured/test_llguidance_tokenizer.py`
compares the two. Other vocabularies, and a tokenizer larger than the logits, use the JSON.
"""

from __future__ import annotations

import llguidance

from radixserve.cpu.memory import trim_heap

_SPECIAL = b"\xff"  # llguidance's mark on a special token's bytes (TokTrie::SPECIAL_TOKEN_MARKER)


def ll_tokenizer(tokenizer, n_vocab: int) -> llguidance.LLTokenizer:
    """llguidance's view of ``tokenizer`` (a radixserve `Tokenizer`) over ``n_vocab`` ids
    (the logits' width). Hands the build's freed memory back to the kernel."""
    eos = sorted(tokenizer.eos_token_ids) or None
    table = tokenizer.token_bytes_table
    if table is None or len(table.pieces) > n_vocab or not _spells_text_as_is(tokenizer):
        view = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=n_vocab,
                                      eos_token=eos)
    else:
        view = llguidance.LLTokenizer(_Vocabulary(tokenizer, table.pieces, n_vocab),
                                      eos_token=eos)
    trim_heap()
    return view


_PROBES = ("a", "Hello world", "\n  x\ty", "<x>")


def _spells_text_as_is(tokenizer) -> bool:
    """Whether the tokens of a text spell exactly that text. llguidance tokenizes pieces
    of output, so it takes a tokenizer that adds nothing: its JSON reader drops a prepended
    space (a ``Prepend`` normalizer, ``Metaspace``'s prepend scheme) from its own copy. Ours
    keeps it for prompts, so such a vocabulary keeps the JSON view."""
    pieces = tokenizer.token_bytes_table.pieces
    return all(b"".join(pieces[i] for i in tokenizer.encode(text, add_special_tokens=False))
               == text.encode() for text in _PROBES)


def _special_ids(backend) -> list[int]:
    """The added tokens llguidance's reader of a ``tokenizers`` JSON marks special: those
    flagged special, and every one spelled ``<...>``."""
    return sorted(i for i, t in backend.get_added_tokens_decoder().items()
                  if t.special or (t.content.startswith("<") and t.content.endswith(">")))


class _Vocabulary:
    """What ``llguidance.LLTokenizer`` reads of a Python tokenizer (its ``TokenizerWrapper``
    contract): every id's bytes, the special ids, eos and bos, and text → ids."""

    is_tokenizer_wrapper = True  # llguidance checks this attribute

    def __init__(self, tokenizer, pieces: list[bytes], n_vocab: int) -> None:
        special = _special_ids(tokenizer.backend)
        tokens = list(pieces)
        for i in special:  # llguidance would add the mark itself; set here with the spelling
            tokens[i] = _SPECIAL + tokenizer.backend.id_to_token(i).encode("utf-8")
        # ids past the vocabulary (a model's padded rows): placeholders, as llguidance pads
        tokens += [_SPECIAL + f"<[{i}]>".encode() for i in range(len(tokens), n_vocab)]
        self.tokens = tokens
        self.special_token_ids = special
        eos = sorted(tokenizer.eos_token_ids)
        self.eos_token_id = eos[0] if eos else None
        self.bos_token_id = None
        self._encode_batch = tokenizer.backend.encode_batch_fast

    def __call__(self, text: str) -> list[int]:
        """The ids of ``text`` (valid UTF-8: llguidance tokenizes a broken tail itself),
        without BOS/EOS, added tokens matched as the tokenizer matches them.

        NOTE: the batch call, because it releases the GIL while it encodes (``encode`` holds
        it). llguidance calls this from a compile on the grammar thread with the grammar's
        forced text, which can be long: ``(a{1000}){1000}`` hands over ~500k characters, and
        ``encode`` stalled the step loop for 0.3-0.45 s."""
        return self._encode_batch([text], add_special_tokens=False)[0].ids
