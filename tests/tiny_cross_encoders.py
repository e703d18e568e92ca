"""Tiny random cross-encoders saved as Hugging Face folders by transformers (one label):
``BertForSequenceClassification`` with a WordPiece tokenizer and
``XLMRobertaForSequenceClassification`` with a Unigram one, both built with ``tokenizers`` and
saved through ``PreTrainedTokenizerFast`` (tokenizer.json + tokenizer_config.json)."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = ("what is the capital of china france beijing paris a large city in northern "
         "horses and cows are both animals where do live query document relevant text "
         "word river mountain lake tree").split()
MAX_LEN = 64  # tokens a pair may hold (the models' positions)


def _wordpiece():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = {t: i for i, t in enumerate(specials + WORDS + letters + [f"##{c}" for c in letters]
                                        + list(".,?!"))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.decoder = decoders.WordPiece()
    return tok, dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                     sep_token="[SEP]", mask_token="[MASK]",
                     model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def _unigram():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ([("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -3.0)]
              + [(f"\u2581{w}", -5.0) for w in WORDS] + [(c, -8.0) for c in letters + list(".,?!")])
    tok = Tokenizer(models.Unigram(pieces, unk_id=3))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok.decoder = decoders.Metaspace()
    return tok, dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                     cls_token="<s>", sep_token="</s>",
                     model_input_names=["input_ids", "attention_mask"])


def make_cross_encoder(kind: str, path: Path, seed: int = 0, hidden: int = 32,
                       layers: int = 2, heads: int = 4, intermediate: int = 64,
                       max_len: int = MAX_LEN) -> Path:
    """Write a random ``kind`` ("bert" or "xlm-roberta") cross-encoder to ``path``."""
    from transformers import (BertConfig, BertForSequenceClassification,
                              PreTrainedTokenizerFast, XLMRobertaConfig,
                              XLMRobertaForSequenceClassification)

    tok, special = _wordpiece() if kind == "bert" else _unigram()
    shape = dict(vocab_size=tok.get_vocab_size(), hidden_size=hidden, num_hidden_layers=layers,
                 num_attention_heads=heads, intermediate_size=intermediate, num_labels=1,
                 initializer_range=0.2, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    if kind == "bert":
        model = BertForSequenceClassification(BertConfig(
            **shape, max_position_embeddings=max_len, type_vocab_size=2, pad_token_id=0))
    else:
        model = XLMRobertaForSequenceClassification(XLMRobertaConfig(
            **shape, max_position_embeddings=max_len + 2, type_vocab_size=1, pad_token_id=1,
            bos_token_id=0, eos_token_id=2))
    model.save_pretrained(path)
    PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_len,
                            **special).save_pretrained(path)
    return path


def reference_scores(path: Path, pairs: list[tuple[str, str]]) -> list[float]:
    """transformers' scores: sigmoid of AutoModelForSequenceClassification's logit on the
    tokenizer's pair encoding (cut as sentence-transformers' CrossEncoder cuts it)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    model.eval()
    scores = []
    with torch.no_grad():
        for q, d in pairs:
            inputs = tok(q, d, truncation="longest_first", return_tensors="pt")
            scores.append(torch.sigmoid(model(**inputs).logits[0, 0]).item())
    return scores
