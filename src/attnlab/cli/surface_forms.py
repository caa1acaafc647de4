"""Exact match of a numbers checkpoint per surface form of the source, through translate's code path.

    python -m attnlab.cli.surface_forms outputs/train/runs/<run>/checkpoints/last.ckpt [--n 600] [--beam 5]

Draws ``n`` integers the way ``numbers.py`` does (number of digits uniform in 1..max_digits, then uniform), none of
them in the checkpoint's training split (regenerated from the data hyper-parameters the checkpoint stores), and
translates each in several surface forms a person may type: the training form, num2words' own English (with
commas), a capital first letter, upper case, double spaces, a trailing period, compounds without their hyphen
("twenty one"). With the normalization stored in the
tokenizer every form should score like the training form; ``--strip-normalizer`` shows the behaviour of a
checkpoint saved before normalization (the input read as typed). A form whose line exceeds the model's source
length counts as wrong ("refused").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import numpy as np

FORMS = ("plain", "num2words_commas", "capitalized", "upper", "double_spaces", "trailing_period", "spaced_compounds")


def surface(plain: str, n: int, form: str) -> str:
    from num2words import num2words

    return {
        "plain": plain,
        "num2words_commas": num2words(n, lang="en"),
        "capitalized": plain[:1].upper() + plain[1:],
        "upper": plain.upper(),
        "double_spaces": plain.replace(" ", "  "),
        "trailing_period": plain + ".",
        "spaced_compounds": plain.replace("-", " "),
    }[form]


def held_out_integers(train: set[int], count: int, max_digits: int, seed: int) -> list[int]:
    """``count`` distinct integers not in ``train``: digits uniform in 1..max_digits, then uniform in that range."""
    from attnlab.data.numbers import digit_range

    rng = np.random.default_rng(seed)
    out: list[int] = []
    seen = set(train)
    for _ in range(1000 * count):
        if len(out) == count:
            break
        lo, hi = digit_range(int(rng.integers(1, max_digits + 1)))
        n = int(rng.integers(lo, hi))
        if n not in seen:
            seen.add(n)
            out.append(n)
    return out


def translate_all(task, lines: list[str], beam: int) -> tuple[list[str | None], int]:
    """Best translation per line (None where the line is refused as too long) and the number refused."""
    from attnlab.decoding import DecodingOptions
    from .translate import translate_lines

    out: list[str | None] = []
    refused = 0
    for i in range(0, len(lines), 32):
        chunk = lines[i : i + 32]
        try:
            out += [h[0][0] for h in translate_lines(task, chunk, DecodingOptions(beam_size=beam))]
        except ValueError:  # one line too long aborts its batch (as it aborts translate's whole file): go one by one
            for line in chunk:
                try:
                    out.append(translate_lines(task, [line], DecodingOptions(beam_size=beam))[0][0][0])
                except ValueError:
                    out.append(None)
                    refused += 1
    return out, refused


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt")
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--strip-normalizer", action="store_true", help="as a checkpoint from before normalization")
    parser.add_argument("--cache-dir", default=os.environ.get("ATTNLAB_CACHE", ".cache"))
    args = parser.parse_args(argv)

    import torch

    from ..runs.load import load_task
    from attnlab.data.numbers import english_words, load_or_generate_numbers, target_words
    from attnlab.data.tokenizer import BPETokenizer
    from ..core.errors import one_line_errors

    torch.set_grad_enabled(False)
    with one_line_errors(logging.getLogger(__name__)):  # a missing, hostile or damaged file: one line, exit 2
        task, raw = load_task(args.ckpt, "attnlab.tasks.translation.TranslationTask", "translation")
    hp = raw.get("datamodule_hyper_parameters") or {}
    if hp.get("source", "numbers") != "numbers":
        raise SystemExit(f"{args.ckpt} was not trained on data=numbers")
    keys = ("target_lang", "max_digits", "train_size", "val_size", "test_size", "seed", "copy_names",
            "copy_fraction", "copy_test_size", "bucket_edges")
    params = {k: (tuple(hp[k]) if k == "bucket_edges" else hp[k]) for k in keys if k in hp}
    splits, _ = load_or_generate_numbers(args.cache_dir, **params)
    train = {p.n for p in splits["train"]}
    numbers = held_out_integers(train, args.n, int(params.get("max_digits", 7)), args.seed)
    lang = params.get("target_lang", "fr")
    if args.strip_normalizer:
        tok = json.loads(task.tokenizer.to_str())
        tok["normalizer"] = None
        task.tokenizer = BPETokenizer.from_str(json.dumps(tok))

    refs = [target_words(n, lang) for n in numbers]
    rows = []
    for form in FORMS:
        lines = [surface(english_words(n), n, form) for n in numbers]
        hyps, refused = translate_all(task, lines, args.beam)
        em = sum(h == r for h, r in zip(hyps, refs)) / len(refs)
        rows.append((form, em, refused))
    name = Path(args.ckpt).resolve()
    print(f"{name}: {len(numbers)} numbers not in the training split, beam {args.beam}, "
          f"normalizer {'stripped' if args.strip_normalizer else 'as stored'}")
    print("| surface form | exact match | lines refused (too long) |\n|---|---|---|")
    for form, em, refused in rows:
        print(f"| {form} | {em:.3f} | {refused} |")


if __name__ == "__main__":
    main()
