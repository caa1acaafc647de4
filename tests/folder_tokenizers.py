"""Tokenizers shaped as a model folder's are, trained here on a few texts (no download):

* ``gpt2``: byte-level BPE, its one special token ``<|endoftext|>`` the last id; nothing put around a text
  (``chat``: a chat model's as Qwen's, ``<|im_end|>`` after it and its ``config.json``'s end of text);
* ``llama``: SentencePiece-style BPE as LLaMA-2's ``tokenizer.json`` has it: ``<unk>``, ``<s>``, ``</s>`` at 0-2, a
  normalizer that prepends ``▁`` and turns spaces into ``▁``, and a post-processor that puts ``<s>`` before a text;
* ``metaspace``: the same with the ``Metaspace`` pre-tokenizer (``prepend_scheme: first``) of newer conversions
  (Mistral, later LLaMA-2 exports) instead of the normalizer;
* ``bert``: WordPiece as BERT's: lowercased, ``[PAD] [UNK] [CLS] [SEP] [MASK]`` at 0-4, ``[CLS] text [SEP]``.

Line breaks are pre-tokenized alone, as SentencePiece's byte fallback keeps them, so that a text cut at a line break
encodes as the whole text does.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

KINDS = ("gpt2", "llama", "metaspace", "bert")
LINES = pre_tokenizers.Split(Regex("\n"), "isolated")
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def folder_tokenizer(kind: str, texts: list[str], vocab_size: int = 300) -> Tokenizer:
    if kind in ("gpt2", "chat"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size - 1, show_progress=False,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.add_special_tokens(["<|endoftext|>", *(["<|im_end|>"] if kind == "chat" else [])])
        return tok
    if kind == "bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, show_progress=False,
                                                                 special_tokens=list(BERT_SPECIALS)))
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
        return tok
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    if kind == "llama":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = LINES
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([LINES, pre_tokenizers.Metaspace("▁", "first", split=False)])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                       special_tokens=["<unk>", "<s>", "</s>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


def library_folder(kind: str, folder: Path, texts: list[str], tied: bool = True):
    """A model folder as ``transformers`` writes it: a GPT-2 (tied, multi-head), a LLaMA (GQA, untied) or a BERT
    (``BertForMaskedLM``, tied unless ``tied=False``) at random initialisation, with its tokenizer
    (``AutoTokenizer`` loads it) and its special ids in ``config.json``; the model."""
    import torch
    import transformers

    tok = folder_tokenizer(kind, texts)
    torch.manual_seed(0)
    if kind in ("gpt2", "chat"):
        end = tok.token_to_id("<|endoftext|>")
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>" if kind == "chat"
                                                    else "<|endoftext|>",
                                                    bos_token="<|endoftext|>")
        config = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2,
                                         n_head=4, bos_token_id=end,
                                         eos_token_id=tok.token_to_id("<|im_end|>") if kind == "chat" else end)
    elif kind == "bert":
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **{
            f"{role}_token": f"[{role.upper()}]" for role in ("pad", "unk", "cls", "sep", "mask")})
        config = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=72, max_position_embeddings=64,
                                         pad_token_id=0, tie_word_embeddings=tied)
    else:
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                    eos_token="</s>")
        config = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=88,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=8, max_position_embeddings=64, tie_word_embeddings=False,
                                          rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    auto = transformers.AutoModelForMaskedLM if kind == "bert" else transformers.AutoModelForCausalLM
    model = auto.from_config(config).eval()
    with torch.no_grad():  # norms off their ones, so that a misplaced one shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return model
