"""``python -m attnlab.explore ckpt=... text=... | image=...``: the explorer page for any input, from every family's
checkpoint (the committed tiny ones in tests/fixtures), as a user runs it; and every kind of bad input is one line,
exit 2, with nothing written.

Each page is also opened in headless Chromium (when installed): it renders without a console error, requests nothing
but itself, and the row it shows for a hovered query is the row stored in the page.
"""

from __future__ import annotations

import re

import pytest
from browser_page import audio_duration, chromium, open_page
from test_safe_checkpoints import FIXTURES, cli

from attnlab.explorer.record import dequantize

CASES = {
    # family: (checkpoint, input options, the page's family, modules it must hold)
    "translation": ("legacy_transformer_mt.ckpt", ["text=two thousand and six"], "tokens", r"cross_attn"),
    "translation_target": ("legacy_transformer_mt.ckpt", ["text=twenty-one", "target=vingt et un"], "tokens",
                           r"cross_attn"),
    "language_model": ("legacy_causal_lm.ckpt", ["text=The for statement"], "tokens", r"attn"),
    "vit": ("legacy_vit.ckpt", ["image={image}"], "image", r"rollout"),
    "tts": ("legacy_tts.ckpt", ["text=twenty one"], "speech", r"cross_attn"),
}


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("img") / "digit.png"
    Image.new("L", (24, 24), 0).save(path)
    with Image.open(path) as im:  # a bright stroke: something to attend to
        for y in range(4, 20):
            im.putpixel((12, y), 255)
        im.save(path)
    return path


def payload(path) -> dict:
    from attnlab.explorer.page import read_payload

    return read_payload(path)


def check_audio(uri: str) -> float:
    """A page's audio ``data:`` URI: a mono 8-bit mu-law WAV at 16 kHz with sound in it; its length in seconds."""
    import base64
    import io

    import soundfile as sf

    assert uri.startswith("data:audio/wav;base64,")
    raw = io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))
    info = sf.info(raw)
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "ULAW"), info
    raw.seek(0)
    wave, _ = sf.read(raw)
    assert len(wave) > 0 and abs(wave).max() > 0.5  # Griffin-Lim's output is peak-normalized to 0.95
    return len(wave) / 16000


def load(ckpt):
    from attnlab.checkpoints import load_task

    return load_task(FIXTURES / ckpt, "attnlab.tasks.base.Task", "attnlab")


@pytest.mark.parametrize("case", ["translation"])
def test_explore_entry_point_writes_the_page(case, tmp_path, cache_dir, image):
    """As a user runs it (a subprocess): the page's path on stdout, the page written."""
    ckpt, options, family, _ = CASES[case]
    out = tmp_path / "page.html"
    options = [o.format(image=image) for o in options]
    r = cli("-m", "attnlab.explore", f"ckpt={FIXTURES / ckpt}", *options, f"out={out}",
            f"hydra.run.dir={tmp_path / 'run'}", cache_dir=cache_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str(out)
    assert payload(out)["view"]["family"] == family


@pytest.mark.parametrize("case", list(CASES))
def test_every_family_page(case, tmp_path, image, browser):
    """Every family's checkpoint, through what the entry point calls (in-process: one load each): the stored maps
    match their labels and are attention rows, the family's view is there, and the page works in the browser."""
    from attnlab.explorer import write_page
    from attnlab.explorer.inputs import record_for_input

    ckpt, options, family, module = CASES[case]
    kw = dict(o.format(image=image).split("=", 1) for o in options)
    task, raw = load(ckpt)
    out = write_page(record_for_input(task, raw, **kw).payload(), tmp_path / "page.html")
    data = payload(out)
    assert data["view"]["family"] == family and len(data["epochs"]) == 1
    names = [m["name"] for m in data["modules"]]
    assert any(re.search(module, n) for n in names), names
    for m in data["modules"]:  # every stored map matches its labels, and its rows are attention rows
        w = dequantize(data["epochs"][0]["maps"][m["name"]])
        assert w.shape[1:] == (len(m["queries"]), len(m["keys"]))
        assert abs(w.sum(-1) - 1).max() < 0.02 + w.shape[-1] / 510, m["name"]
    if case == "translation_target":  # the decoder side is the given target, teacher-forced
        cross = next(m for m in data["modules"] if "cross_attn" in m["name"])
        assert "vingt" in "".join(cross["queries"]) and len(cross["queries"]) >= 3
    if family == "image":
        assert data["view"]["image"].startswith("data:image/png;base64,")
    if family == "speech":  # the audio of what it spoke, compact: 8-bit mu-law at 16 kHz
        assert check_audio(data["epochs"][0]["audio"]) > 0
    if browser is not None:
        check_in_browser(browser, out, data)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, or None where it or playwright is not installed (the browser test proper,
    test_explorer_browser.py, skips with the reason)."""
    with chromium() as b:
        yield b


def check_in_browser(b, path, data):
    with open_page(b, path) as opened:
        page = opened.page
        name = page.input_value("#module")
        page.select_option("#head", "0")
        page.keyboard.press("ArrowDown")  # query 1 (the arrow keys move the query in every family)
        w = dequantize(data["epochs"][0]["maps"][name])[0]
        w = w[min(1, w.shape[0] - 1)]
        shown = [float(x) for x in page.get_attribute("#readout", "data-row").split(",")]
        assert shown == pytest.approx(w.tolist(), abs=6e-5)
        if data["view"]["family"] == "speech":  # the synthesized audio plays: the browser decodes its length
            assert audio_duration(page) == pytest.approx(check_audio(data["epochs"][0]["audio"]), abs=0.01)
        assert opened.errors == [] and opened.requests == [path.as_uri()], (opened.errors, opened.requests)


BAD = [
    # (options, the checkpoint's fixture, message): the space of bad input kinds
    ([], "vit", r"give the input: text="),
    (["image={missing}"], "vit", r"image=.*: no such file"),
    (["text=[1,2]"], "mt", r"text=.* is not allowed"),
    (["target=[1]", "text=seven"], "mt", r"target=.* is not allowed"),
    (["text=seven", "out={folder}"], "mt", r"out=.* is a folder"),
    # after the checkpoint is read: the wrong input for its family, unreadable, too long, empty
    (["image={notimage}"], "vit", r"is not an image this can read"),
    (["text=seven"], "vit", r"image= is missing: give an image file"),
    (["image={image}"], "mt", r"image= is for a Vision Transformer checkpoint"),
    (["text=seven", "target=sept"], "lm", r"target= is for a translation checkpoint"),
    (["text=" + " ".join(["seventy-seven thousand"] * 20)], "mt", r"this model reads at most \d+"),
    (["text=" + "a" * 400], "tts", r"this model reads at most \d+"),
    (["text= "], "lm", r"text= is empty"),
]
CKPTS = {"vit": "legacy_vit.ckpt", "mt": "legacy_transformer_mt.ckpt", "lm": "legacy_causal_lm.ckpt",
         "tts": "legacy_tts.ckpt"}


def bad_options(options, tmp_path, image):
    notimage = tmp_path / "notimage.png"
    notimage.write_text("not a PNG")
    fill = dict(missing=tmp_path / "none", notimage=notimage, image=image, folder=tmp_path)
    return [o.format(**fill) for o in options]


@pytest.mark.parametrize("options, ckpt, message", BAD)
def test_bad_input_is_a_user_error(options, ckpt, message, tmp_path, image):
    """Every kind of bad input raises the one-line error the entry point prints (exit 2: a UserError), checked in
    the order the entry point checks: the options before the checkpoint is read, then the input against it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from attnlab.errors import UserError
    from attnlab.explore import check_options
    from attnlab.explorer.inputs import record_for_input
    from attnlab.paths import CONF_DIR

    options = bad_options(options, tmp_path, image) + [f"ckpt={FIXTURES / CKPTS[ckpt]}"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("explore", overrides=options)
    with pytest.raises(UserError, match=message) as e:
        check_options(cfg)
        task, raw = load(CKPTS[ckpt])
        record_for_input(task, raw, text=cfg.text, target=cfg.target, image=cfg.image)
    assert "\n" not in str(e.value) and e.value.exit_code == 2


def test_bad_input_through_the_entry_point(tmp_path, cache_dir, image):
    """The entry point prints that error as one line on stderr and exits 2, writing no page (a file that is not an
    image: found after the checkpoint is loaded, the latest point an input error can stop it)."""
    r = cli("-m", "attnlab.explore", f"ckpt={FIXTURES / 'legacy_vit.ckpt'}",
            *bad_options(["image={notimage}"], tmp_path, image),
            f"hydra.run.dir={tmp_path / 'run'}", cache_dir=cache_dir)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and not list(tmp_path.rglob("*.html"))
