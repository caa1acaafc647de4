"""Text normalization: declared in a data config (``data.normalize``), saved with the tokenizer, applied everywhere.

The normalization is built as a ``tokenizers`` normalizer and set on the BPE tokenizer itself, so it is serialized
with it (``BPETokenizer.to_str``, hence into every checkpoint) and the very same function runs on the training
data, on validation, in ``translate``, in the notebooks and in the claims: a user's "Three hundred and five." is
encoded exactly like the training form "three hundred and five".

A spec has five independent steps, applied in this order::

    unicode:    null | NFC | NFKC      Unicode normalization form
    remove:     "<characters>"         each one replaced by a space (punctuation the corpus does not carry)
    whitespace: true | false           runs of whitespace collapsed to one space, both ends stripped
    case:       keep | lower | corpus_words
                                       corpus_words: every word the training text writes in lower case only is
                                       folded to it ("THREE", "Three" -> "three"); other words keep their case
                                       (names copied to the target, claim E15)
    replace:    [[<regex>, <text>], …] each match (Oniguruma syntax, as ``tokenizers`` runs it) replaced by the
                                       text, in order: forms the corpus writes one way ("twenty one" as
                                       "twenty-one", data=numbers); the text is literal (no group references);
                                       for the LM's streamed text a pattern must not match across lines

``corpus_words`` folds one regular expression per word, so it is meant for a closed vocabulary (the number
words); at most ``MAX_CORPUS_WORDS`` words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from tokenizers import Regex, normalizers

from ..core.errors import ConfigError

UNICODE_FORMS = ("NFC", "NFKC")
CASES = ("keep", "lower", "corpus_words")
MAX_CORPUS_WORDS = 2000
# A word for case folding: a run of letters (no digits, no underscore), as Python's and Oniguruma's \p{L} see it.
_WORD = re.compile(r"[^\W\d_]+")


@dataclass(frozen=True)
class TextNormalization:
    """What ``data.normalize`` declares; ``normalizer()`` builds the ``tokenizers`` normalizer."""

    unicode: str | None = None
    remove: str = ""
    whitespace: bool = False
    case: str = "keep"
    replace: tuple[tuple[str, str], ...] = ()  # (regex, text) pairs; a list of pairs (or a mapping) in the config

    @classmethod
    def from_config(cls, cfg: Mapping | None, key: str = "data.normalize") -> TextNormalization:
        """The spec from a config mapping (missing keys take the defaults above); a ConfigError names a bad key."""
        if cfg is None:
            return cls()
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{key} must be a mapping of unicode/remove/whitespace/case, got {cfg!r}")
        cfg = dict(cfg)
        unknown = sorted(set(cfg) - {"unicode", "remove", "whitespace", "case", "replace"})
        if unknown:
            raise ConfigError(f"{key}: unknown key(s) {', '.join(unknown)}; valid: unicode, remove, whitespace, case, "
                              f"replace")
        cfg["replace"] = _replacements(cfg.get("replace"), f"{key}.replace")
        spec = cls(**{**asdict(cls()), **cfg})
        if spec.unicode is not None and spec.unicode not in UNICODE_FORMS:
            raise ConfigError(f"{key}.unicode={spec.unicode!r} is not one of null, {', '.join(UNICODE_FORMS)}")
        if spec.case not in CASES:
            raise ConfigError(f"{key}.case={spec.case!r} is not one of {', '.join(CASES)}")
        if not isinstance(spec.remove, str):
            raise ConfigError(f"{key}.remove must be a string of characters, got {spec.remove!r}")
        if not isinstance(spec.whitespace, bool):
            raise ConfigError(f"{key}.whitespace must be true or false, got {spec.whitespace!r}")
        return spec

    def as_dict(self) -> dict:
        """The spec as config values; ``replace`` only when given (the cache keys of specs without one stay)."""
        spec = asdict(self)
        spec.pop("replace")
        return {**spec, "replace": [list(pair) for pair in self.replace]} if self.replace else spec

    def normalizer(self, corpus: Iterable[str] = ()) -> normalizers.Normalizer:
        """The ``tokenizers`` normalizer; ``corpus`` (the training text it applies to) is read for
        ``case=corpus_words`` only. Always a ``Sequence`` (possibly empty), never None: a tokenizer without
        one was trained before normalization existed (``BPETokenizer`` warns about it)."""
        steps: list[normalizers.Normalizer] = []
        if self.unicode == "NFC":
            steps.append(normalizers.NFC())
        elif self.unicode == "NFKC":
            steps.append(normalizers.NFKC())
        if self.remove:
            chars = "".join(sorted(set(self.remove)))
            steps.append(normalizers.Replace(Regex("[" + "".join(_escape(c) for c in chars) + "]"), " "))
        if self.whitespace:
            steps += [normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
        if self.case == "lower":
            steps.append(normalizers.Lowercase())
        elif self.case == "corpus_words":
            words = corpus_lower_words(corpus)
            if len(words) > MAX_CORPUS_WORDS:
                raise ConfigError(
                    f"data.normalize.case=corpus_words folds each word of the corpus separately; this corpus has "
                    f"{len(words)} lower-case words (at most {MAX_CORPUS_WORDS}): use case=lower or case=keep"
                )
            # "(?i)" matches any case; the look-arounds keep "one" from matching inside "someone" or "Ones"
            steps += [normalizers.Replace(Regex(rf"(?i)(?<!\p{{L}}){w}(?!\p{{L}})"), w) for w in words]
        steps += [normalizers.Replace(Regex(pattern), text) for pattern, text in self.replace]
        return normalizers.Sequence(steps)


def _replacements(value, key: str) -> tuple[tuple[str, str], ...]:
    """``replace`` from the config: a mapping (or a list of pairs) of Oniguruma regex -> literal text; a
    ConfigError names a pattern ``tokenizers`` cannot compile."""
    if value is None:
        return ()
    pairs = list(value.items()) if isinstance(value, Mapping) else value  # a config's lists are ListConfigs
    is_list = lambda v: isinstance(v, Sequence) and not isinstance(v, str)  # noqa: E731
    if not is_list(pairs) or not all(is_list(p) and len(p) == 2 and all(isinstance(x, str) for x in p)
                                     for p in pairs):
        raise ConfigError(f"{key} must map regular expressions to replacement text, got {value!r}")
    for pattern, _ in pairs:
        try:
            Regex(pattern)
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for a bad pattern
            raise ConfigError(f"{key}: {pattern!r} is not a regular expression tokenizers can use ({e})") from None
    return tuple((str(p), str(t)) for p, t in pairs)


def corpus_lower_words(texts: Iterable[str]) -> list[str]:
    """Sorted words (letter runs) that occur in ``texts`` in lower case and never in any other case."""
    seen: dict[str, bool] = {}
    for text in texts:
        for w in _WORD.findall(text):
            low = w.lower()
            seen[low] = seen.get(low, True) and w == low
    return sorted(w for w, only_lower in seen.items() if only_lower and w != w.upper())


def normalizer_json(normalizer: normalizers.Normalizer | None) -> str:
    """The normalizer's JSON as ``tokenizers`` serializes it (for cache keys); "null" for None."""
    if normalizer is None:
        return "null"
    return normalizer.__getstate__().decode("utf-8")


def _escape(c: str) -> str:
    """One character inside an Oniguruma character class."""
    return "\\" + c if c in "\\]^-[" else c


# --- how much a saved normalizer can lengthen a text ---------------------------------------------------------------
# A tokenizer read from a file (a checkpoint's) brings its normalizer: a chain of Replace rules that each lengthen
# what they match (40 rules "a" -> "aa" make one "a" 2**40 characters) would exhaust memory on the first input. The
# bound is computed from the rules, before any text is normalized: a Replace multiplies the length by at most its
# replacement's length over its pattern's shortest match (its replacement plus one where the pattern may match the
# empty string); a Unicode form by the most characters one character decomposes into. The product over the rules is
# pessimistic (rules rarely all lengthen the same text), hence a generous limit: exponential chains exceed it at once.
MAX_GROWTH = 1e6
_GROWTH = {"NFC": 3, "NFD": 4, "NFKC": 18, "NFKD": 18, "Lowercase": 3, "Strip": 1, "StripAccents": 1,
           "BertNormalizer": 18}
_CORPUS_WORD = re.compile(r"\(\?i\)\(\?<!\\p\{L\}\)(\w+)\(\?!\\p\{L\}\)")  # what case=corpus_words writes


def _shortest_match(pattern: Mapping) -> int:
    """A lower bound on a Replace pattern's match length: a plain string's length; the patterns this module writes
    (a corpus word between look-arounds, a character class, ``\\s+``); 0 for any other regex."""
    if isinstance(pattern.get("String"), str):
        return len(pattern["String"])
    regex = pattern.get("Regex")
    if not isinstance(regex, str):
        return 0
    word = _CORPUS_WORD.fullmatch(regex)
    if word:
        return len(word.group(1))
    try:  # Python's parser reads most Oniguruma patterns alike; one it cannot read may match the empty string
        from re import _parser

        return int(_parser.parse(regex).getwidth()[0])
    except Exception:  # noqa: BLE001 - re.error, or syntax only Oniguruma has (\p{L})
        return 0


def growth(spec: Mapping | None) -> float:
    """An upper bound on how many times longer the normalizer ``spec`` (its JSON as a dict; None: none) makes a
    text; infinite for a kind of normalizer it does not know."""
    if spec is None:
        return 1.0
    kind = spec.get("type")
    if kind == "Sequence":
        total = 1.0
        for step in spec.get("normalizers") or []:
            total *= growth(step)
        return total
    if kind == "Replace":
        content = spec.get("content") if isinstance(spec.get("content"), str) else ""
        shortest = _shortest_match(spec.get("pattern") or {})
        return max(1.0, len(content) / shortest) if shortest else len(content) + 1.0
    if kind == "Prepend":
        return 1.0 + len(str(spec.get("prepend", "")))
    return float(_GROWTH.get(str(kind), float("inf")))


def growth_problem(spec: Mapping | None) -> str | None:
    """Why a saved normalizer could exhaust memory (one phrase), or None."""
    bound = growth(spec)
    if bound <= MAX_GROWTH:
        return None
    return (f"its normalizer could make a text up to {bound:.3g} times longer (at most {MAX_GROWTH:g}): "
            f"damaged or hand-made")
