"""The attention explorer page in a real browser: headless Chromium (Debian's ``chromium``) driven by playwright,
JavaScript on, network off.

A tiny model of each family (``debug=fast`` and smaller) trains for two epochs in-process with the real
AttentionMapCallback, which writes the page; a second callback captures the same maps in float32 at the same
moments. Through the DOM, for every epoch on the slider, every layer (and the ViT's rollout), every head and the mean
over heads, and a first, middle and last query (hovering a token, a patch of the image, or a TTS frame's column of
the map), the weights the page shows equal that row of the captured map, as the page stores it (cropped or whole,
docs/explorer.md), within the 8-bit storage's bound (row max / 510, + display rounding). The page logs no console
error and requests nothing but itself.
"""

from __future__ import annotations

import json
import re

import hydra
import lightning as L
import pytest
import torch

from attnlab.analysis.rollout import attention_rollout
from attnlab.callbacks.attention_maps import AttentionMapCallback
from attnlab.explorer.record import natural_key
from attnlab.families import families
from attnlab.modules.attention import capture_attention
from attnlab.runs.build import build_model
from browser_page import chromium, missing, open_page
from helpers import compose_train

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

# a high learning rate so that two steps move the maps enough to tell the epochs apart on the slider
FAST = ["model.optimizer.lr=0.03", "model.scheduler.warmup_steps=1", "logger=none"]
SIZES = {"transformer_mt": ["model.net.d_model=16", "model.net.n_layers=1"], "vit": ["model.net.n_layers=2"],
         # the TTS prenet's dropout stays on in eval mode: the page's forward and the snapshot's would differ
         "tts": ["model.net.prenet_always_dropout=false"]}
# every registered family with attention maps (attnlab.families); the token page and the image page by default
FAMILIES = {f.name: [f"model={f.name}", "debug=fast", *f.test_overrides, *SIZES.get(f.name, []), *FAST]
            for f in families() if "attn" in f.groups}
IN_DEFAULT_SUITE = ("transformer_mt", "vit")
MAX_TOKENS = 16  # the callback's crop of token maps in these pages
# What a page holds of the captured maps (docs/explorer.md, Size): token maps cropped to their first MAX_TOKENS
# queries and keys; the ViT's, the sequence classifier's and the TTS's whole; of the TTS, the cross-attention only.
WHOLE = ("vit", "sequence_classifier", "tts")
ONLY = {"tts": "cross_attn"}


def stored(family: str, maps: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The captured float maps cut as docs/explorer.md says the family's page stores them."""
    keep = ONLY.get(family)
    return {n: w if family in WHOLE else w[:, :MAX_TOKENS, :MAX_TOKENS]
            for n, w in maps.items() if keep is None or keep in n}


class Snapshot(L.Callback):
    """The float32 maps of the attention sample at each validation end (what the page stores, unquantized)."""

    def __init__(self):
        self.maps: list[dict[str, torch.Tensor]] = []

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        sample = pl_module.attention_sample(16)
        pl_module.eval()
        with torch.no_grad(), capture_attention(pl_module) as maps:
            pl_module.attention_forward(**sample.inputs)
        pl_module.train()
        maps = {n: w[0].float() for n, w in maps.items()}
        if hasattr(pl_module.net, "grid"):
            names = sorted(maps, key=natural_key)
            maps["rollout"] = attention_rollout([maps[n] for n in names])[None]  # (1, T, T)
        self.maps.append(maps)


@pytest.fixture(scope="module", params=[
    pytest.param(name, marks=() if name in IN_DEFAULT_SUITE else pytest.mark.slow) for name in FAMILIES])
def family_page(request, tmp_path_factory, cache_dir):
    torch.manual_seed(0)
    tmp = tmp_path_factory.mktemp(request.param)
    cfg = compose_train(FAMILIES[request.param], tmp, cache_dir)
    dm = hydra.utils.instantiate(cfg.data)
    model = build_model(cfg.model)
    page = tmp / "attention" / "explorer.html"
    # max_layers=0: no PNGs for the token families (the explorer keeps every layer regardless)
    snap = Snapshot()
    maps_cb = AttentionMapCallback(max_tokens=MAX_TOKENS, max_layers=0, dirpath=tmp / "png")
    trainer = L.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0,
                        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp,
                        callbacks=[maps_cb, snap])
    trainer.fit(model, datamodule=dm)
    assert page.is_file() and len(snap.maps) == 2
    return request.param, page, [stored(request.param, maps) for maps in snap.maps]


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def shown_row(page) -> torch.Tensor:
    return torch.tensor([float(x) for x in page.get_attribute("#readout", "data-row").split(",")], dtype=torch.float32)


def check_row(shown: torch.Tensor, want: torch.Tensor, what: str, row_max: float | None = None) -> None:
    """``shown`` is ``want`` within the 8-bit storage's bound: half a step of the stored rows' maxima (``row_max``:
    for a mean over heads or queries, the mean of the averaged rows' maxima, which can exceed the mean row's), plus
    the page's 4 decimals."""
    assert shown.shape == want.shape, what
    tol = (float(want.max()) if row_max is None else row_max) / 510 + 6e-5
    assert torch.allclose(shown, want, rtol=0, atol=tol), f"{what}: page {shown.tolist()} vs {want.tolist()}"


def test_page_shows_the_captured_rows(browser, family_page):
    family, path, snaps = family_page
    with open_page(browser, path) as opened:
        page = opened.page
        modules = page.eval_on_selector_all("#module option", "os => os.map(o => o.value)")
        assert set(modules) == set(snaps[0]), modules
        grid = page.evaluate("() => JSON.parse(document.getElementById('attnlab-data').textContent).view.grid || 0")
        prefix = page.evaluate("() => JSON.parse(document.getElementById('attnlab-data').textContent).view.prefix || 0")
        checked = 0
        for epoch, maps in enumerate(snaps):
            page.eval_on_selector("#epoch", "(e, v) => { e.value = v; e.dispatchEvent(new Event('input')); }",
                                  str(epoch))
            assert page.text_content("#epoch-label").startswith(f"{epoch} ")
            for name in modules:
                page.select_option("#module", name)
                w = maps[name]
                heads = page.eval_on_selector_all("#head option", "os => os.map(o => o.value)")
                assert heads == (["mean"] if w.shape[0] > 1 else []) + [str(h) for h in range(w.shape[0])]
                for head in heads:
                    page.select_option("#head", head)
                    m = w.mean(0) if head == "mean" else w[int(head)]
                    row_max = w.amax(-1).mean(0) if head == "mean" else m.amax(-1)  # (queries,)
                    first = prefix if family == "vit" else 0
                    for q in sorted({first, (first + m.shape[0] - 1) // 2, m.shape[0] - 1}):
                        if family == "vit":  # hover the patch in the image
                            box = page.locator("#image-canvas").bounding_box()
                            i = q - prefix
                            cell = box["width"] / grid
                            page.mouse.move(box["x"] + (i % grid + 0.5) * cell, box["y"] + (i // grid + 0.5) * cell)
                        elif family == "tts":  # hover the frame: a column of the map (characters down)
                            geo = json.loads(page.get_attribute("#heatmap", "data-geometry"))
                            assert geo["transposed"]
                            page.hover("#heatmap", position={"x": geo["left"] + (q + 0.5) * geo["cw"],
                                                             "y": geo["top"] + geo["ch"] / 2})
                        else:  # hover the query token
                            page.hover(f"#queries .tok[data-i='{q}']")
                        assert page.get_attribute("#readout", "data-query") == str(q)
                        bound = float(row_max[q])
                        check_row(shown_row(page), m[q], f"{family} epoch {epoch} {name} head {head} query {q}", bound)
                        keys = page.eval_on_selector_all("#keys .tok", "ts => ts.map(t => Number(t.dataset.weight))")
                        check_row(torch.tensor(keys, dtype=torch.float32), m[q], f"{family} key tokens", bound)
                        checked += 1
            if family == "vit":  # the class-token and mean-query buttons
                page.select_option("#module", "rollout")
                page.click("#q-mean")
                patches = maps["rollout"][0, prefix:]
                check_row(shown_row(page), patches.mean(0), f"vit epoch {epoch} mean query",
                          float(patches.amax(-1).mean()))
                if prefix:
                    page.click("#q-cls")
                    check_row(shown_row(page), maps["rollout"][0, 0], f"vit epoch {epoch} class token")
                page.keyboard.press("Escape")  # the buttons pin their query; Esc lets hovering choose again
        assert checked >= 2 * len(modules) * 3
        # the slider switches maps: the two epochs' maps differ, and each epoch showed its own (checked above)
        assert any(not torch.allclose(snaps[0][n], snaps[1][n], atol=1e-3) for n in snaps[0])
        # a thumbnail of the small multiples selects its layer and head
        thumb = page.locator("#grid canvas").nth(1)
        page.eval_on_selector("#module", "e => e.selectedIndex = 0")
        thumb.click()
        assert page.input_value("#module") == thumb.get_attribute("data-module")
        assert page.input_value("#head") == thumb.get_attribute("data-head")
        assert opened.errors == []
        assert opened.requests == [path.as_uri()], opened.requests  # itself only: scripts, styles, image inline


# the image drawn as the page draws it, and the plain canvas's pixel at the centre of every patch but the query's
PLAIN_PIXELS = """([n, q]) => new Promise((ok) => {
    const c = document.getElementById('plain-canvas'), img = new Image();
    img.onload = () => {
        const ref = document.createElement('canvas'), g = ref.getContext('2d');
        ref.width = c.width; ref.height = c.height; g.imageSmoothingEnabled = false;
        g.drawImage(img, 0, 0, c.width, c.height);
        const cell = c.width / n, at = (cv, i) => Array.from(cv.getContext('2d').getImageData(
            Math.floor((i % n + 0.5) * cell), Math.floor((Math.floor(i / n) + 0.5) * cell), 1, 1).data);
        const out = [];
        for (let i = 0; i < n * n; i++) if (i !== q) out.push([at(c, i), at(ref, i)]);
        ok(out);
    };
    img.src = JSON.parse(document.getElementById('attnlab-data').textContent).view.image;
})"""


def test_page_opens_on_the_last_layer_and_a_content_query(browser, family_page):
    """What a person sees first: the deepest layer (an encoder-decoder's last cross-attention; the ViT's last layer,
    not the rollout) and a query with content: a token that is not <bos>/<eos>/punctuation, or the ViT's centre patch
    (not the class token), its image shown as it is beside the weighted one."""
    family, path, snaps = family_page
    names = sorted((n for n in snaps[0] if n != "rollout"), key=natural_key)
    cross = [n for n in names if "cross" in n]
    want = (cross or names)[-1]
    with open_page(browser, path, width=1400, height=900) as opened:
        page = opened.page
        assert page.input_value("#module") == want
        q = int(page.get_attribute("#readout", "data-query"))
        data = page.evaluate("() => JSON.parse(document.getElementById('attnlab-data').textContent)")
        if family == "vit":
            grid, prefix = data["view"]["grid"], data["view"].get("prefix", 0)
            assert q == prefix + (grid // 2) * grid + grid // 2  # the centre patch
            assert page.is_visible("#plain-canvas") and page.is_visible("#image-canvas")
            pixels = page.evaluate(PLAIN_PIXELS, [grid, q - prefix])
            assert all(shown == drawn for shown, drawn in pixels), pixels  # undimmed: the image itself
        else:
            module = next(m for m in data["modules"] if m["name"] == want)
            label = module["queries"][q]
            assert not re.fullmatch(r"<\w+>|\W*", label), (q, label)  # a word, not <bos>, <eos> or punctuation
        assert opened.errors == []
