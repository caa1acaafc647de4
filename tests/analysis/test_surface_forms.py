"""The surface-form measurement draws numbers outside the training split and writes the forms a person types."""

from attnlab.cli.surface_forms import FORMS, held_out_integers, surface
from attnlab.data.numbers import english_words


def test_held_out_integers_avoid_the_training_split():
    train = set(range(0, 100, 2))
    got = held_out_integers(train, 40, max_digits=2, seed=0)
    assert len(got) == len(set(got)) == 40 and not set(got) & train and all(0 <= n < 100 for n in got)
    assert held_out_integers(train, 40, max_digits=2, seed=0) == got  # deterministic


def test_surface_forms():
    n = 1_200_021
    forms = {f: surface(english_words(n), n, f) for f in FORMS}
    assert forms["plain"] == "one million two hundred thousand and twenty-one"
    assert forms["num2words_commas"] == "one million, two hundred thousand and twenty-one"
    assert forms["capitalized"].startswith("One million") and forms["upper"].startswith("ONE MILLION")
    assert "  " in forms["double_spaces"] and forms["trailing_period"].endswith("twenty-one.")
    assert forms["spaced_compounds"].endswith("and twenty one")
