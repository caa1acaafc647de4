"""Number chunks (magnitude groups) of source and target words/tokens, and the argmax-attention alignment rate (E2)."""

import numpy as np
import pytest
import torch

from attnlab.analysis.alignment import NO_CHUNK, alignment_counts, token_chunks
from attnlab.data.numbers import CHUNKS, english_words, target_words, word_chunks
from attnlab.data.tokenizer import train_bpe

M, K, H, R = (CHUNKS.index(c) for c in ("millions", "thousands", "hundreds", "rest"))


def test_word_chunks_of_a_seven_digit_number():
    en, fr = english_words(1234567), target_words(1234567, "fr")
    assert en == "one million two hundred and thirty-four thousand five hundred and sixty-seven"
    assert word_chunks(en, "en") == [M, M, K, K, K, K, K, H, H, R, R]
    assert fr == "un million deux cent trente-quatre mille cinq cent soixante-sept"
    assert word_chunks(fr, "fr") == [M, M, K, K, K, K, H, H, R]


@pytest.mark.parametrize("n,en,fr", [
    (1001, [K, K, R, R], [K, R]),  # "one thousand and one" / "mille un": "and" goes with the rest
    (101000, [K] * 5, [K] * 3),  # "one hundred and one thousand": the thousands' hundreds stay in the thousands
    (1000001, [M, M, R, R], [M, M, R]),
    (500, [H, H], [H, H]),  # "five hundred" / "cinq cents" (plural marker)
    (71, [R], [R, R, R]),  # "seventy-one" / "soixante et onze"
])  # fmt: skip
def test_word_chunks_edge_cases(n, en, fr):
    assert word_chunks(english_words(n), "en") == en
    assert word_chunks(target_words(n, "fr"), "fr") == fr


def test_both_sides_have_the_same_groups_in_the_same_order():
    rng = np.random.default_rng(0)
    for n in [0, 7, 100, 1000, 10**6, 2 * 10**6, 10**9, *rng.integers(0, 10**10, 300).tolist()]:
        en, fr = word_chunks(english_words(n), "en"), word_chunks(target_words(n, "fr"), "fr")
        assert sorted(set(en)) == sorted(set(fr)), n
        assert en == sorted(en) and fr == sorted(fr), n  # groups are contiguous, largest first


def test_word_chunks_refuses_german():
    with pytest.raises(ValueError, match="not 'de'"):
        word_chunks("einundzwanzig", "de")


def test_token_chunks_follow_the_words():
    ints = [*range(0, 3000, 7), *range(10**6, 10**7, 99991)]
    tok = train_bpe("\n".join([english_words(n) for n in ints] + [target_words(n, "fr") for n in ints]), 1024)
    text = english_words(1234567)
    chunks = token_chunks(tok, text, "en")
    ids = tok.encode(text)
    assert len(chunks) == len(ids)
    words = [tok.decode([i]).strip() for i in ids]
    assert chunks[words.index("million")] == M
    assert chunks[words.index("thousand")] == K
    assert chunks[len(words) - 1 - words[::-1].index("-")] == R  # the hyphen of "sixty-seven"
    assert chunks[words.index("-")] == K  # the hyphen of "thirty-four"


def test_alignment_counts():
    src = [M, M, K, R, NO_CHUNK]  # e.g. 4 words + <eos>
    tgt = [M, K, R, NO_CHUNK]  # the <eos> row is not scored
    perfect = torch.zeros(4, 5)
    perfect[0, 1] = perfect[1, 2] = perfect[2, 3] = perfect[3, 4] = 1.0
    c = alignment_counts(perfect, src, tgt)
    assert (c.hits, c.total, c.mass) == (3, 3, 3.0)
    assert c.chance == pytest.approx(2 / 5 + 1 / 5 + 1 / 5)  # same-chunk share of the 5 real source tokens
    assert c.diagonal == 3  # 3 target words over 4 source words: t=0 -> word 0 (M), 1 -> word 2 (K), 2 -> word 3 (R)
    shifted = alignment_counts(torch.eye(5), src, [M, M, K, R, NO_CHUNK])
    assert shifted.diagonal == shifted.hits == 4  # t -> word int((t + 0.5) * 4 / 4) = t: M, M, K, R against M, M, K, R
    assert shifted.total == 4
    on_eos = torch.zeros(4, 6)
    on_eos[:, 4] = 1.0  # all on <eos>; column 5 (padding) is ignored
    assert alignment_counts(on_eos, src, tgt).hits == alignment_counts(on_eos, src, tgt).mass == 0
    assert alignment_counts(on_eos, src, tgt).on_eos == 3 and c.on_eos == 0
    half = torch.zeros(4, 5)
    half[:, 0] = half[:, 4] = 0.5  # half on "M", half on <eos>
    c = alignment_counts(half, src, tgt)
    assert c.mass == pytest.approx(0.5) and c.rates()["mass"] == pytest.approx(0.5 / 3)
    with pytest.raises(ValueError, match="smaller"):
        alignment_counts(torch.zeros(2, 5), src, tgt)
