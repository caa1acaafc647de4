"""The ids that data and models must agree on, kept below both (docs/layout.md: models never import data).

* BPE vocabularies (:mod:`attnlab.data.tokenizer`) start with four special tokens, in this order, in every
  vocabulary: the models pad, start and stop on these ids.
* A tokenizer made elsewhere (a Hugging Face model's: GPT-2, LLaMA, Qwen) has its own special tokens at its own
  ids; :func:`special_ids` finds its end-of-text token by name (and its start token: else it starts with its end
  token, as GPT-2 does), so the ids travel with the tokenizer file and nothing else has to carry them.
* The TTS reads characters from a fixed alphabet (:mod:`attnlab.data.characters`), so a checkpoint needs no
  vocabulary file. ``<eos>`` is the last id, so every character's id is the same whether a net uses it or not
  (``text_eos``).
"""

from __future__ import annotations

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))

# the names the field gives its special tokens, in the order they are looked for (BERT's end a text with [SEP] and
# start it with [CLS])
END_NAMES: tuple[str, ...] = ("<eos>", "</s>", "<|endoftext|>", "<|end_of_text|>", "[SEP]")
START_NAMES: tuple[str, ...] = ("<bos>", "<s>", "<|begin_of_text|>", "[CLS]")
PAD_NAMES, UNK_NAMES, MASK_NAMES = ("<pad>", "[PAD]"), ("<unk>", "[UNK]"), ("[MASK]", "<mask>")


def _first(specials: dict[str, int], names: tuple[str, ...], default: int | None = None) -> int | None:
    return next((specials[n] for n in names if n in specials), default)


def special_ids(specials: dict[str, int]) -> dict[str, int] | None:
    """``{"pad", "bos", "eos", "unk"} -> id`` of a tokenizer whose special tokens are ``specials`` (name -> id): this
    repo's at 0-3, or another's found by name (no pad or unk token: its end token stands in); None when it has no
    end-of-text token."""
    eos = _first(specials, END_NAMES)
    if eos is None:
        return None
    return {"pad": _first(specials, PAD_NAMES, eos), "bos": _first(specials, START_NAMES, eos), "eos": eos,
            "unk": _first(specials, UNK_NAMES, eos)}


def mask_id(specials: dict[str, int]) -> int | None:
    """The id of a tokenizer's mask token (a BERT's ``[MASK]``); None when it has none (attnlab's: the masked LM
    gives it a row of its own)."""
    return _first(specials, MASK_NAMES)


def specials_in(tokenizer_json: str) -> dict[str, int]:
    """name -> id of the special tokens a ``tokenizer.json`` text adds; ValueError (or KeyError, TypeError) for a
    text that is not one."""
    import json

    added = json.loads(tokenizer_json).get("added_tokens") or []
    return {t["content"]: int(t["id"]) for t in added if t.get("special", True)}


def is_own(specials: dict[str, int]) -> bool:
    """This repo's special tokens, at ids 0-3."""
    return all(specials.get(token) == i for i, token in enumerate(SPECIAL_TOKENS))


CHAR_PAD, CHAR_UNK, CHAR_EOS = "<pad>", "<unk>", "<eos>"
ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789'\".,;:!?-()"
CHAR_SYMBOLS: tuple[str, ...] = (CHAR_PAD, CHAR_UNK, *ALPHABET, CHAR_EOS)
CHAR_PAD_ID, CHAR_UNK_ID, CHAR_EOS_ID = 0, 1, len(CHAR_SYMBOLS) - 1  # <eos> = 50


def char_text(ids) -> str:
    """The text of character ids: ``?`` for ``<unk>``, nothing for ``<pad>`` and ``<eos>``."""
    return "".join(CHAR_SYMBOLS[i] if CHAR_UNK_ID < i < CHAR_EOS_ID else ("?" if i == CHAR_UNK_ID else "")
                   for i in ids)
