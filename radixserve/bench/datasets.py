"""Request generators for ``radixserve bench serve``: deterministic (``seed``) text workloads.

A workload is a list of `Conversation`s; each is one arrival and runs its `Turn`s in order,
every turn resending the whole history (the user turns plus the server's previous answers).
Single-shot datasets (random, shared-prefix, mixed) have one turn per conversation.

Prompts are plain text made of words from `VOCAB`, common English words that BPE tokenizers
mostly encode as one token each (with their leading space), so a length in tokens is
approximated as that many words. ``words_per_token`` (measured with the server's ``/tokenize``,
see `radixserve.bench.serve`) rescales the word counts when exactness matters.
"""

from __future__ import annotations

import builtins
import keyword
import math
import random
from dataclasses import dataclass, field

_WORDS = """
the of and to in is was for on that with as by at from his her this which or are an be had
not have but were they their one all there been has who more when will would time if no
can about so out up into other year two only new some first also over after these them could
its may most than people made many where such through between then any three world back
use well state part during under both while city because down those since each what school
same found day house before being how life work last place long name still high number
group three water book small great own system power just form early again point family
line around music game later left right side end light given open until order little local
small general public against above thing large color green blue red black white river road
north south east west market value paper story money field table window garden question answer
study reason result plan model change heart voice horse apple stone cloud train bridge letter
minute evening morning winter summer spring autumn forest ocean island valley mountain animal
village doctor teacher student friend mother father sister brother child people country
language science history nature energy metal glass wood paper fire earth air sound song dance
"""
VOCAB = tuple(dict.fromkeys(_WORDS.split()))

MIXED_OUTPUT_LENS = {"short": 16, "normal": 128, "long": 1024}


@dataclass(slots=True)
class Turn:
    """One user message and the answer length asked for it (``max_tokens``)."""

    text: str
    output_len: int


@dataclass(slots=True)
class Conversation:
    """One arrival: its turns run one after another. ``tag`` labels it in the records
    (the mixed class, the shared-prefix group, ...)."""

    turns: list[Turn]
    tag: str = ""
    index: int = field(default=0)


def words(rng: random.Random, n: int) -> str:
    """``n`` random words from `VOCAB`, space-separated (``n`` ≥ 1)."""
    return " ".join(rng.choices(VOCAB, k=max(1, n)))


def _n_words(tokens: int, words_per_token: float) -> int:
    return max(1, round(tokens * words_per_token))


def random_dataset(num_prompts: int, input_len: int, output_len: int, seed: int = 0,
                   words_per_token: float = 1.0) -> list[Conversation]:
    """``num_prompts`` independent prompts of about ``input_len`` tokens each."""
    _positive(num_prompts=num_prompts, input_len=input_len, output_len=output_len)
    rng = random.Random(seed)
    n = _n_words(input_len, words_per_token)
    return _indexed([Conversation([Turn(words(rng, n), output_len)], "random")
                     for _ in range(num_prompts)])


def shared_prefix_dataset(num_groups: int, prompts_per_group: int, prefix_len: int,
                          suffix_len: int, output_len: int, seed: int = 0,
                          words_per_token: float = 1.0) -> list[Conversation]:
    """``num_groups`` prefixes of ``prefix_len`` tokens, each followed by ``prompts_per_group``
    different suffixes of ``suffix_len`` tokens; the groups' requests are interleaved
    (shuffled), so a group's prefix is reused while other groups' prefixes are in flight."""
    _positive(num_groups=num_groups, prompts_per_group=prompts_per_group,
              prefix_len=prefix_len, suffix_len=suffix_len, output_len=output_len)
    rng = random.Random(seed)
    convs = []
    for g in range(num_groups):
        prefix = words(rng, _n_words(prefix_len, words_per_token))
        for _ in range(prompts_per_group):
            suffix = words(rng, _n_words(suffix_len, words_per_token))
            convs.append(Conversation([Turn(f"{prefix} {suffix}", output_len)], f"group{g}"))
    rng.shuffle(convs)
    return _indexed(convs)


def multi_turn_dataset(num_conversations: int, turns: int, input_len: int, output_len: int,
                       seed: int = 0, words_per_token: float = 1.0) -> list[Conversation]:
    """``num_conversations`` chats of ``turns`` user messages of about ``input_len`` tokens;
    the history (and so the prompt) grows by one user message and one answer per turn."""
    _positive(num_conversations=num_conversations, turns=turns, input_len=input_len,
              output_len=output_len)
    rng = random.Random(seed)
    n = _n_words(input_len, words_per_token)
    return _indexed([Conversation([Turn(words(rng, n), output_len) for _ in range(turns)],
                                  "multi-turn") for _ in range(num_conversations)])


def mixed_dataset(num_prompts: int, input_len: int, short: float = 0.3, normal: float = 0.5,
                  long: float = 0.2, seed: int = 0,
                  words_per_token: float = 1.0) -> list[Conversation]:
    """A shuffled mixture of very short answers (16 tokens), normal ones (128) and long,
    chain-of-thought-like ones (1024), in proportions ``short : normal : long`` (normalized;
    counts by largest remainder, so they sum to ``num_prompts``)."""
    _positive(num_prompts=num_prompts, input_len=input_len)
    shares = {"short": short, "normal": normal, "long": long}
    if any(v < 0 for v in shares.values()) or sum(shares.values()) <= 0:
        raise ValueError("the mixed proportions must be ≥ 0 and not all 0")
    counts = _split(num_prompts, shares)
    rng = random.Random(seed)
    n = _n_words(input_len, words_per_token)
    convs = [Conversation([Turn(words(rng, n), MIXED_OUTPUT_LENS[kind])], kind)
             for kind, count in counts.items() for _ in range(count)]
    rng.shuffle(convs)
    return _indexed(convs)


_OPS = ("+", "-", "*")
_IDENTS = tuple(w for w in VOCAB if not keyword.iskeyword(w) and w not in dir(builtins))


def _function(rng: random.Random, num_lines: int) -> tuple[str, str]:
    """A small Python function of about ``num_lines`` statements, and its name."""
    name = "_".join(rng.choices(_IDENTS, k=2))
    args = rng.sample(_IDENTS, 3)
    lines = [f"def {name}({', '.join(args)}):"]
    names = list(args)
    for _ in range(max(1, num_lines)):
        target = rng.choice(_IDENTS) + "_value"
        a, b = rng.choice(names), rng.choice(names)
        if rng.random() < 0.3:
            lines.append(f"    if {a} > {b}:")
            lines.append(f"        {target} = {a} {rng.choice(_OPS)} {rng.randint(1, 9)}")
            lines.append("    else:")
            lines.append(f"        {target} = {b} {rng.choice(_OPS)} {a}")
        else:
            lines.append(f"    {target} = {a} {rng.choice(_OPS)} {b}")
        names.append(target)
    lines.append(f"    return {names[-1]}")
    return "\n".join(lines), name


def code_edit_dataset(num_prompts: int, input_len: int, output_len: int, seed: int = 0,
                      words_per_token: float = 1.0) -> list[Conversation]:
    """Edit a function: the prompt holds a Python function of about ``input_len`` tokens and
    asks for it back with one small change (a rename), so most of the answer repeats the
    prompt (the case for prompt-lookup drafts)."""
    _positive(num_prompts=num_prompts, input_len=input_len, output_len=output_len)
    rng = random.Random(seed)
    convs = []
    for _ in range(num_prompts):
        code, name = _function(rng, max(1, round(input_len * words_per_token / 12)))
        new_name = "_".join(rng.choices(_IDENTS, k=2))
        text = (f"Rename the function {name} to {new_name} and return the whole function, "
                f"otherwise unchanged.\n\n```python\n{code}\n```\n\nHere is the edited "
                f"function:\n\n```python\ndef {new_name}(")
        convs.append(Conversation([Turn(text, output_len)], "code-edit"))
    return _indexed(convs)


def summarise_dataset(num_prompts: int, input_len: int, output_len: int, seed: int = 0,
                      words_per_token: float = 1.0) -> list[Conversation]:
    """Summarise a document: the prompt holds a document of about ``input_len`` tokens (a few
    repeated-topic sentences) and asks for a summary that quotes it."""
    _positive(num_prompts=num_prompts, input_len=input_len, output_len=output_len)
    rng = random.Random(seed)
    convs = []
    for _ in range(num_prompts):
        sentences = []
        while sum(len(x.split()) for x in sentences) < _n_words(input_len, words_per_token):
            sentences.append(f"The {rng.choice(VOCAB)} of the {rng.choice(VOCAB)} is "
                             f"{words(rng, rng.randint(4, 10))}.")
        doc = " ".join(sentences)
        text = (f"Document:\n{doc}\n\nSummarise the document above, quoting its key "
                f"sentences word for word.\n\nSummary: \"{sentences[0].split()[0]}")
        convs.append(Conversation([Turn(text, output_len)], "summarise"))
    return _indexed(convs)


def from_args(args, words_per_token: float = 1.0) -> list[Conversation]:
    """The conversations that ``bench serve``'s ``args`` ask for (ValueError on bad sizes)."""
    w, seed = words_per_token, args.seed
    if args.dataset == "random":
        return random_dataset(args.num_prompts, args.input_len, args.output_len, seed, w)
    if args.dataset == "shared-prefix":
        return shared_prefix_dataset(args.num_groups, args.prompts_per_group, args.prefix_len,
                                     args.suffix_len, args.output_len, seed, w)
    if args.dataset == "code-edit":
        return code_edit_dataset(args.num_prompts, args.input_len, args.output_len, seed, w)
    if args.dataset == "summarise":
        return summarise_dataset(args.num_prompts, args.input_len, args.output_len, seed, w)
    if args.dataset == "multi-turn":
        return multi_turn_dataset(args.num_conversations, args.turns, args.input_len,
                                  args.output_len, seed, w)
    return mixed_dataset(args.num_prompts, args.input_len, args.mix_short, args.mix_normal,
                         args.mix_long, seed, w)


def arrival_times(n: int, request_rate: float, burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Start offsets in seconds of ``n`` arrivals at ``request_rate`` per second on average:
    gamma-distributed gaps (shape ``burstiness``, mean 1/rate) — Poisson for burstiness 1,
    burstier (clumps and lulls) below 1, more regular above. An infinite rate: all at 0."""
    if request_rate <= 0:
        raise ValueError("--request-rate must be > 0")
    if burstiness <= 0:
        raise ValueError("--burstiness must be > 0")
    if math.isinf(request_rate):
        return [0.0] * n
    rng = random.Random(seed + 1)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (request_rate * burstiness))
    return out


def _split(n: int, shares: dict[str, float]) -> dict[str, int]:
    total = sum(shares.values())
    exact = {k: n * v / total for k, v in shares.items()}
    counts = {k: math.floor(x) for k, x in exact.items()}
    by_remainder = sorted(exact, key=lambda k: exact[k] - counts[k], reverse=True)
    for k in by_remainder[:n - sum(counts.values())]:
        counts[k] += 1
    return counts


def _indexed(convs: list[Conversation]) -> list[Conversation]:
    for i, c in enumerate(convs):
        c.index = i
    return convs


def _positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be ≥ 1 (got {value})")
