"""``python -m attnlab.explore ckpt=... text=... | image=...``: the explorer page for any input, from every family's
checkpoint (every family with an ``explorer_input`` in the registry: its committed tiny checkpoint in
tests/fixtures, or one made here in one training step), as a user runs it; and every kind of bad input is one line,
exit 2, with nothing written.

Each page is also opened in headless Chromium (when installed): it renders without a console error, requests nothing
but itself, and the row it shows for a hovered query is the row stored in the page.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from browser_page import audio_duration, chromium, open_page
from helpers import compose_train
from test_safe_checkpoints import FIXTURES, cli

from attnlab.explorer.record import dequantize
from attnlab.families import families, for_net, get
from attnlab.core.paths import ROOT

# What each kind of explorer input (a family's ``explorer_input``) is run on: options, the page's view family, and a
# module the page must hold.
KINDS = {
    "translation": (["text=two thousand and six"], "tokens", r"attn"),
    "text": (["text=The for statement"], "tokens", r"attn"),
    "image": (["image={image}"], "image", r"rollout"),
    "speech": (["text=twenty one"], "speech", r"cross_attn"),
    "ids": (["text=3 17 5 9"], "tokens", r"self_attn"),
}
EXPLORED = [f for f in families() if f.explorer_input]
# case: (family, checkpoint, input options, the page's family, modules it must hold); every family the registry
# gives an explorer input, and the translation decoder on a given target
CASES = {f.name: (f.name, None, *KINDS[f.explorer_input]) for f in EXPLORED}
CASES["translation_target"] = ("transformer_mt", "legacy_transformer_mt.ckpt",
                               ["text=twenty-one", "target=vingt et un"], "tokens", r"cross_attn")


def fixture_of(family) -> Path | None:
    """A committed checkpoint of ``family``: ``legacy_<name>.ckpt``, else any fixture of its net."""
    named = FIXTURES / f"legacy_{family.name}.ckpt"
    if named.is_file():
        return named
    for path in sorted(FIXTURES.glob("*.ckpt")):
        net = (torch.load(path, map_location="cpu", weights_only=False, mmap=True).get("hyper_parameters") or {})
        if for_net(str((net.get("net") or {}).get("_target_"))) is family:
            return path
    return None


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, cache_dir):
    """``(model, *overrides) -> checkpoint``: a committed one of the family, or one made here (the family's
    ``debug=fast`` run, one training step, saved as train.py saves it), once per module."""
    made = {}

    def get_ckpt(model: str, *overrides: str) -> Path:
        family = get(model)
        if not overrides and (path := fixture_of(family)) is not None:
            return path
        if (model, overrides) not in made:
            made[model, overrides] = make_checkpoint(model, overrides, tmp_path_factory.mktemp(model), cache_dir)
        return made[model, overrides]

    return get_ckpt


def make_checkpoint(model: str, overrides, folder: Path, cache_dir: str) -> Path:
    import hydra
    import lightning as L

    from attnlab.runs.build import build_model

    family = get(model)
    cfg = compose_train([f"model={model}", "debug=fast", *family.test_overrides, *overrides], folder, cache_dir)
    L.seed_everything(0)
    dm = hydra.utils.instantiate(cfg.data)
    task = build_model(cfg.model, cfg.get("optim"), cfg.get("sched"))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, limit_val_batches=0, num_sanity_val_steps=0,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(task, datamodule=dm)
    trainer.save_checkpoint(folder / "last.ckpt")
    return folder / "last.ckpt"


def test_every_explorer_input_has_its_function_and_a_case():
    from attnlab.cli.explore_inputs import INPUTS
    from attnlab.families import EXPLORER_INPUTS

    assert set(INPUTS) == set(EXPLORER_INPUTS) == set(KINDS)
    # docs/explorer.md's table of inputs names each family under the input it declares
    table = (ROOT / "docs" / "explorer.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*?) \|", table, flags=re.M))
    assert {kind: set(re.findall(r"`(\w+)`", rows.get(kind, ""))) for kind in EXPLORER_INPUTS} == {
        kind: {f.name for f in EXPLORED if f.explorer_input == kind} for kind in EXPLORER_INPUTS}


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
    from attnlab.runs.load import load_task

    return load_task(FIXTURES / ckpt, "attnlab.tasks.base.Task", "attnlab")


@pytest.mark.parametrize("case", ["transformer_mt"])
def test_explore_entry_point_writes_the_page(case, tmp_path, cache_dir, image, checkpoints):
    """As a user runs it (a subprocess): the page's path on stdout, the page written."""
    model, ckpt, options, family, _ = CASES[case]
    ckpt = ckpt or checkpoints(model)
    out = tmp_path / "page.html"
    options = [o.format(image=image) for o in options]
    r = cli("-m", "attnlab.explore", f"ckpt={FIXTURES / ckpt}", *options, f"out={out}",
            f"hydra.run.dir={tmp_path / 'run'}", cache_dir=cache_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str(out)
    assert payload(out)["view"]["family"] == family


@pytest.mark.parametrize("case", list(CASES))
def test_every_family_page(case, tmp_path, image, browser, checkpoints):
    """Every family's checkpoint, through what the entry point calls (in-process: one load each): the stored maps
    match their labels and are attention rows, the family's view is there, and the page works in the browser."""
    from attnlab.explorer import write_page
    from attnlab.cli.explore_inputs import record_for_input

    model, ckpt, options, family, module = CASES[case]
    kw = dict(o.format(image=image).split("=", 1) for o in options)
    task, raw = load(ckpt or checkpoints(model))
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
    if get(model).explorer_input == "text":  # the masked LM reads both sides, the causal LM only the past
        w = dequantize(data["epochs"][0]["maps"][names[0]])
        assert (np.triu(w, 1).sum() > 0.1) == (model == "masked_lm"), model
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
        first = int(page.get_attribute("#readout", "data-query"))  # the page opens on a content query
        page.keyboard.press("ArrowDown")  # the next query (the arrow keys move the query in every family)
        w = dequantize(data["epochs"][0]["maps"][name])[0]
        w = w[min(first + 1, w.shape[0] - 1)]
        shown = [float(x) for x in page.get_attribute("#readout", "data-row").split(",")]
        assert shown == pytest.approx(w.tolist(), abs=6e-5)
        if data["view"]["family"] == "speech":  # the synthesized audio plays: the browser decodes its length
            assert audio_duration(page) == pytest.approx(check_audio(data["epochs"][0]["audio"]), abs=0.01)
            # what it spoke is free-running, and so is the map: the page says both
            assert "free-running" in page.text_content("#map-mode")
            assert "free-running" in page.text_content("#audio-mode")
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
    (["text=seven"], "vit", r"text= is not an input of an image classifier \(Image.*\): give image=$"),
    (["image={image}"], "mt", r"image= is not an input of a translation model .*: give text= \(and target=\)$"),
    (["text=seven", "target=sept"], "lm", r"target= is not an input of a language model \(CausalLMTask\): give text=$"),
    (["text=" + " ".join(["seventy-seven thousand"] * 20)], "mt", r"this model reads at most \d+"),
    (["text=" + "a" * 400], "tts", r"this model reads at most \d+"),
    (["text= "], "lm", r"text= is empty"),
    (["text=3 x 5"], "cls", r"'x' is not a token id of this model \(whole numbers 0 to 511"),
    (["text='3 ²'"], "cls", r"'²' is not a token id"),
    (["text=3 512"], "cls", r"'512' is not a token id of this model"),
    (["text=" + " 3" * 33], "cls", r"the input has 33 token ids; this model reads at most 32"),
    (["text=3 17"], "rnn_cls", r"encoder of kind rnn .*: it has no attention to show"),
]
# the checkpoints: (model, overrides) for the `checkpoints` fixture
CKPTS = {"vit": ("vit",), "mt": ("transformer_mt",), "lm": ("causal_lm",), "tts": ("tts",),
         "cls": ("sequence_classifier",), "rnn_cls": ("sequence_classifier", "model.encoder=rnn")}


def bad_options(options, tmp_path, image):
    notimage = tmp_path / "notimage.png"
    notimage.write_text("not a PNG")
    fill = dict(missing=tmp_path / "none", notimage=notimage, image=image, folder=tmp_path)
    return [o.format(**fill) for o in options]


@pytest.mark.parametrize("options, ckpt, message", BAD)
def test_bad_input_is_a_user_error(options, ckpt, message, tmp_path, image, checkpoints):
    """Every kind of bad input raises the one-line error the entry point prints (exit 2: a UserError), checked in
    the order the entry point checks: the options before the checkpoint is read, then the input against it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from attnlab.core.errors import UserError
    from attnlab.cli.explore import check_options
    from attnlab.cli.explore_inputs import record_for_input
    from attnlab.core.paths import CONF_DIR

    path = checkpoints(*CKPTS[ckpt])
    options = bad_options(options, tmp_path, image) + [f"ckpt={path}"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("explore", overrides=options)
    with pytest.raises(UserError, match=message) as e:
        check_options(cfg)
        task, raw = load(path)
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
