"""Every variant of the block groups reaches every transformer family where it applies, and trains: the attention
variants modern LMs use (attn=gqa|mqa, attn.qk_norm, attn.window, pos=alibi) and the one-YAML ffn=geglu.

Each (family, variant) is composed as `python train.py model=<family> debug=fast <variant>` would, built by
train.py's own build_model, checked in its modules, then trained for a few AdamW steps on a fixed synthetic batch
(the loss must fall). Where a variant does not apply it is refused in one line (ALiBi on the ViT's 2-D grid; attn=
on the RNN models).
"""

from __future__ import annotations

import pytest
import torch
from helpers import compose_train, run_cli

from attnlab.families import families, get
from attnlab.modules.attention import MultiHeadAttention
from attnlab.modules.positional import ALiBi
from attnlab.runs.build import build_model

# every registered family built from the attention group (attnlab.families): a new one is tested by being declared
FAMILIES = [f.name for f in families() if "attn" in f.groups]
VARIANTS = {
    "gqa": ["attn=gqa"],  # debug=fast has 2 heads: gqa's 2 KV heads = MHA's count, so gqa is tested at 4 heads
    "mqa": ["attn=mqa"],
    "qk_norm": ["attn.qk_norm=true"],
    "window": ["attn.window=3"],
    "alibi": ["pos=alibi"],
    "geglu": ["ffn=geglu"],
}
HEADS = 4  # every family at 4 heads of 8 dimensions: gqa (2 KV heads) is then really grouped


def build(family: str, variant: list[str], tmp_path) -> torch.nn.Module:
    cfg = compose_train([f"model={family}", "debug=fast", f"model.net.n_heads={HEADS}", *variant], tmp_path)
    return build_model(cfg.model).net


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_variant_reaches_every_attention_and_trains(family, variant, tmp_path):
    if variant == "alibi" and (family == "vit" or "pos" not in get(family).groups):
        pytest.skip("not applicable: refused (vit) or no pos group (tts), see the tests below")
    torch.manual_seed(0)
    net = build(family, VARIANTS[variant], tmp_path).train()
    attns = [m for m in net.modules() if isinstance(m, MultiHeadAttention)]
    assert attns
    selfs = [m for m in attns if not m.is_cross]
    if variant in ("gqa", "mqa"):
        assert {m.kv_heads for m in attns} == {2 if variant == "gqa" else 1}
    if variant == "qk_norm":
        assert all(m.q_norm is not None and m.k_norm is not None for m in attns)
    if variant == "window":
        assert {m.window for m in selfs} == {3} and {m.window for m in attns if m.is_cross} <= {None}
    if variant == "alibi":
        assert all(isinstance(m.positions, ALiBi) for m in selfs)
    if variant == "geglu":
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
