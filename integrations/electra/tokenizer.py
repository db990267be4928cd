"""Tokenizers: an ELECTRA-style WordPiece trained on the corpus (numbered canonically, so every process gets the
same ids), or a saved one loaded and checked for the special tokens the models need."""
from __future__ import annotations

from .errors import UserError
from .output import quiet_transformers

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def train_wordpiece(texts, vocab_size: int, lowercase: bool = True):
    """Train an uncased BERT-style WordPiece fast tokenizer (ELECTRA's kind) on strings or batches of strings."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                        show_progress=False)
    tok.train_from_iterator(texts, trainer)
    # The trainer breaks count ties in hash-map order, so ids differ from process to process; renumber the token
    # set canonically (specials first, then sorted). The set itself can still differ at the vocabulary cut-off.
    learned = tok.get_vocab()
    ordered = list(SPECIAL_TOKENS) + sorted(t for t in learned if t not in SPECIAL_TOKENS)
    tok.model = models.WordPiece({token: i for i, token in enumerate(ordered)}, unk_token="[UNK]")
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=512)


def load_tokenizer(location: str, need_mask: bool = False):
    """A saved fast tokenizer (a directory, or a hub id when online) with [PAD]/[CLS]/[SEP] (and [MASK] when
    ``need_mask``, as pretraining does); anything else is a `UserError`."""
    from transformers import AutoTokenizer

    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(location)
    except Exception as error:
        first_line = (str(error).splitlines() or [""])[0]
        raise UserError(f"could not load a tokenizer from {location}: {type(error).__name__}: {first_line}") from None
    needed = ("pad_token_id", "cls_token_id", "sep_token_id") + (("mask_token_id",) if need_mask else ())
    missing = [name[:-3] for name in needed if getattr(tokenizer, name, None) is None]
    if missing or not tokenizer.is_fast:
        raise UserError(f"the tokenizer of {location} must be a fast BERT/ELECTRA-style tokenizer "
                        f"(missing: {', '.join(missing) or 'fast backend'})")
    return tokenizer
