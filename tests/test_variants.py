"""Every variant of the block groups reaches every transformer family where it applies, and trains: every option of
conf/norm, conf/ffn, conf/attn, conf/pos and conf/moe (read from the folders: a new YAML file is tested by adding
it) and the attention settings modern LMs use (attn.qk_norm, attn.window).

Each (family, variant) is composed as `python train.py model=<family> debug=fast <variant>` would, built by
train.py's own build_model, checked in its modules (every class the option's YAML names is built, in every layer
it applies to), then trained for a few AdamW steps on a fixed synthetic batch (the loss must fall). Where a variant
does not apply it is refused in one line (a sequence position on the ViT's 2-D grid; attn= on the RNN models).
"""

from __future__ import annotations

import pytest
import torch
from helpers import compose_train, run_cli
from hydra.errors import InstantiationException
from hydra.utils import get_object
from omegaconf import OmegaConf

from attnlab.builders import part_config
from attnlab.core.errors import SettingError
from attnlab.core.paths import CONF_DIR
from attnlab.families import families, get
from attnlab.modules.attention import MultiHeadAttention
from attnlab.modules.positional import ALiBi
from attnlab.modules.settings import PositionSettings
from attnlab.runs.build import build_model

# every registered family built from the attention group (attnlab.families): a new one is tested by being declared
FAMILIES = [f.name for f in families() if "attn" in f.groups]
GROUPS = ("norm", "ffn", "attn", "pos", "moe")
# the options conf/train.yaml picks (a variant is any other one)
DEFAULTS = {k: v for entry in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "train.yaml").defaults)
            if isinstance(entry, dict)
            for k, v in entry.items() if k in GROUPS}
VARIANTS = {
    **{f"{g}={o}": [f"{g}={o}"] for g in GROUPS for o in sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml"))
       if o != DEFAULTS[g]},
    "attn.qk_norm": ["attn.qk_norm=true"],
    "attn.window": ["attn.window=3"],
}


def named_classes(node) -> set[type]:
    """The nn.Module classes a part's config names (its ``_target_``s, at any depth)."""
    found = set()
    if isinstance(node, dict):
        target = node.get("_target_")
        obj = get_object(target) if isinstance(target, str) else None
        if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
            found.add(obj)
        for value in node.values():
            found |= named_classes(value)
    return found


HEADS = 4  # every family at 4 heads of 8 dimensions: gqa (2 KV heads) is then really grouped


def build(family: str, variant: list[str], tmp_path) -> torch.nn.Module:
    cfg = compose_train([f"model={family}", "debug=fast", f"model.net.n_heads={HEADS}", *variant], tmp_path)
    return build_model(cfg.model).net


def test_every_conf_option_is_a_variant():
    assert {"attn=gqa", "attn=mqa", "pos=alibi", "ffn=geglu", "norm=rms", "moe=on"} <= set(VARIANTS)
    assert set(DEFAULTS) == set(GROUPS)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_variant_reaches_every_attention_and_trains(family, variant, tmp_path):
    group = variant.split("=")[0].split(".")[0]
    if group not in get(family).groups:
        pytest.skip(f"model={family} is not built from the {group} group (refused: see the test below)")
    torch.manual_seed(0)
    try:
        net = build(family, VARIANTS[variant], tmp_path).train()
    except InstantiationException as e:  # a sequence position on the ViT's 2-D grid: the part's one-line refusal
        while e.__cause__ is not None and not isinstance(e, SettingError):
            e = e.__cause__
        assert isinstance(e, SettingError), e
        assert group == "pos" and variant.split("=")[1] in PositionSettings.SEQUENCE_ONLY, e
        assert "2-D grid" in str(e) and "\n" not in str(e)
        return
    attns = [m for m in net.modules() if isinstance(m, MultiHeadAttention)]
    assert attns
    selfs = [m for m in attns if not m.is_cross]
    if "=" in variant:  # every class the option's YAML names is built
        built = {type(m) for m in net.modules()}
        wanted = named_classes(part_config(group, variant.split("=")[1]))
        assert wanted <= built, (wanted - built)
    if variant in ("attn=gqa", "attn=mqa"):
        assert {m.kv_heads for m in attns} == {2 if variant == "attn=gqa" else 1}
    if variant == "attn.qk_norm":
        assert all(m.q_norm is not None and m.k_norm is not None for m in attns)
    if variant == "attn.window":
        assert {m.window for m in selfs} == {3} and {m.window for m in attns if m.is_cross} <= {None}
    if variant == "pos=alibi":
        assert all(isinstance(m.positions, ALiBi) for m in selfs)
    if variant == "ffn=geglu":
        ffns = [m for m in net.modules() if type(m).__name__ == "FeedForward"]
        assert ffns and all(f.gate_proj is not None and isinstance(f.activation, torch.nn.GELU) for f in ffns)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(4):
        loss = get(family).batch_loss(net, torch.Generator().manual_seed(0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses


def test_alibi_on_the_vit_is_refused_in_one_line(tmp_path):
    out = run_cli(["model=vit", "pos=alibi", "debug=fast", "logger=none", f"hydra.run.dir={tmp_path}/run"],
                  timeout=180)
    assert out.returncode == 2, out.stdout[-2000:]
    assert "pos=alibi is a 1-D sequence position; patches sit on a 2-D grid" in out.stdout
    assert "Traceback" not in out.stdout


@pytest.mark.parametrize("override", ["attn=gqa", "pos=alibi"])
def test_variants_on_a_model_not_built_from_the_group_are_refused(override, tmp_path):
    out = run_cli(["model=tts" if override.startswith("pos") else "model=seq2seq_baseline", override,
                   f"hydra.run.dir={tmp_path}/run"], timeout=120)
    assert out.returncode == 2 and "does not apply to model=" in out.stdout and "Traceback" not in out.stdout
