"""Every config in conf/ composes; block groups reach every block; bad choices fail clearly."""

from __future__ import annotations

import itertools

import pytest
import torch
from cli_checks import one_error_line
from helpers import compose_train, run_cli
from omegaconf import OmegaConf

from attnlab.families import BLOCK_GROUPS, families, model_names
from attnlab.modules.attention import MultiHeadAttention
from attnlab.modules.block import EncoderBlock
from attnlab.modules.feedforward import FeedForward
from attnlab.modules.moe import MixtureOfExperts
from attnlab.core.paths import CONF_DIR
from attnlab.runs.build import build_model
from attnlab.core.errors import ConfigError
from attnlab.runs.config_tree import check_block_groups, used_groups

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("local", "hydra"))


IMAGE_DATA = ("data=digits", "data=cifar10")
SPEECH_DATA = ("data=espeak", "data=ljspeech")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize(
    "override", [f"{g}={o}" for g in GROUPS for o in options(g)], ids=lambda s: s.replace("/", "_")
)
def test_every_option_composes_and_resolves(override, tmp_path):
    extra = ["data.path=/tmp/x.txt"] if override == "data=text_file" else []
    if override in IMAGE_DATA:  # image data sets: the model that reads data.image_size, not the default LM
        extra.append("model=vit")
    if override in SPEECH_DATA:  # speech: the model that reads data.mel
        extra += ["model=tts"] + (["data.path=/tmp/LJSpeech-1.1"] if override == "data=ljspeech" else [])
    cfg = compose_train([override, *extra], tmp_path)
    OmegaConf.resolve(cfg)  # every interpolation resolves
    assert cfg.model._target_ and cfg.trainer._target_


def test_generate_config_composes(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("generate", overrides=["ckpt_path=x.ckpt"])
    assert cfg.max_new_tokens > 0 and cfg.ckpt_path == "x.ckpt"


NORMS = {"pre": (torch.nn.LayerNorm, "pre"), "post": (torch.nn.LayerNorm, "post"), "rms": (torch.nn.RMSNorm, "pre")}
ACTS = {"relu": torch.nn.ReLU, "gelu": torch.nn.GELU, "swiglu": torch.nn.SiLU}


@pytest.mark.parametrize("norm,ffn,moe", list(itertools.product(NORMS, ACTS, ["off", "on"])))
def test_block_groups_reach_every_block(norm, ffn, moe, tmp_path):
    cfg = compose_train(["model=causal_lm", f"norm={norm}", f"ffn={ffn}", f"moe={moe}", "model.net.n_layers=3"], tmp_path)
    net = build_model(cfg.model).net
    assert len(net.decoder.layers) == 3
    norm_type, placement = NORMS[norm]
    for block in net.decoder.layers:
        assert isinstance(block, EncoderBlock) and block.pre_norm == (placement == "pre")
        assert isinstance(block.sa_norm, norm_type) and isinstance(block.ffn_norm, norm_type)
        experts = list(block.ffn.experts) if moe == "on" else [block.ffn]
        assert isinstance(block.ffn, MixtureOfExperts) == (moe == "on")
        if moe == "on":
            assert len(experts) == cfg.moe.num_experts and block.ffn.top_k == cfg.moe.top_k
            assert block.ffn.balance == cfg.moe.balance == "layer"
        for e in experts:
            assert isinstance(e, FeedForward) and isinstance(e.activation, ACTS[ffn])
            assert (e.gate_proj is not None) == (ffn == "swiglu")
            assert (e.up_proj.bias is None) == (e.down_proj.bias is None) == (ffn == "swiglu")  # SwiGLU: bias-free
    assert isinstance(net.decoder.final_norm, torch.nn.Identity) == (norm == "post")


@pytest.mark.parametrize("model", model_names())
def test_a_familys_declared_groups_are_the_ones_its_config_interpolates(model, tmp_path):
    """The registry's groups of a family (what train.py refuses or tags by) agree with conf/model/<model>.yaml:
    exactly the groups its net interpolates (``norm: ${norm}``); the classifier narrows them by its encoder."""
    cfg = compose_train([f"model={model}"], tmp_path)
    text = repr(OmegaConf.to_container(cfg.model.net, resolve=False))
    assert used_groups(cfg) == [g for g in BLOCK_GROUPS if "${" + g + "}" in text]
    rnn = compose_train(["model=sequence_classifier", "model.encoder=rnn"], tmp_path)
    assert used_groups(rnn) == []


def test_group_override_for_a_model_not_built_from_it_is_refused(tmp_path):
    cfg = compose_train(["model=tts", "pos=rotary"], tmp_path)
    with pytest.raises(ConfigError, match="pos= does not apply to model=tts"):
        check_block_groups(cfg, ["model=tts", "pos=rotary"])
    check_block_groups(cfg, ["attn=gqa", "norm=rms"])  # groups it uses are fine


@pytest.mark.parametrize("group,option,listed", [("norm", "group", "rms"), ("optim", "foo", "sgd")])
def test_cli_unknown_option_lists_choices_exit_2(group, option, listed, tmp_path):
    out = run_cli([f"{group}={option}", f"hydra.run.dir={tmp_path}/run"], timeout=120)
    assert out.returncode == 2  # like every other bad input (docs/reliability.md)
    assert f"Could not find '{group}/{option}'" in out.stdout and "Available options" in out.stdout
    assert listed in out.stdout and "Traceback" not in out.stdout
    assert not (tmp_path / "run").exists()


def test_cli_unknown_key_exit_2_and_a_traceback_on_request(tmp_path):
    out = run_cli(["model.net.nope=1", f"hydra.run.dir={tmp_path}/run"], timeout=120)
    assert out.returncode == 2 and "Could not override 'model.net.nope'" in out.stdout
    assert "Traceback" not in out.stdout
    full = run_cli(["model.net.nope=1", f"hydra.run.dir={tmp_path}/run"], timeout=120, env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 1 and "Traceback" in full.stdout  # Python's own exit for an uncaught exception


def test_cli_inapplicable_group_gets_one_line_error(tmp_path):
    out = run_cli(["model=seq2seq_attention", "attn=gqa", f"hydra.run.dir={tmp_path}/run"], timeout=120)
    assert out.returncode == 2
    assert "attn= does not apply to model=seq2seq_attention" in out.stdout
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_part_that_refuses_its_setting_answers_before_lightning_starts(tmp_path):
    """pos=rotary on the ViT's 2-D grid: the part's own refusal, from the build on the meta device that counts the
    parameters, before the config tree is printed or Lightning seeds anything; no folder is left."""
    out = run_cli(["model=vit", "pos=rotary", "debug=fast", f"hydra.run.dir={tmp_path}/run"], timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    assert "pos=rotary is a 1-D sequence position; patches sit on a 2-D grid" in out.stdout
    assert "Seed set to" not in out.stdout and "CONFIG" not in out.stdout and "Traceback" not in out.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("override", "nearest"), [("+sed=1", "seed"), ("++presicion=bf16-mixed", "precision"),
                                                  ("+zzz=1", None), ("+trainr.max_epochs=2", "trainer")])
def test_a_new_top_level_key_is_refused_with_the_nearest_known_one(override, nearest, tmp_path):
    out = run_cli([override, "debug=fast", f"hydra.run.dir={tmp_path}/run"], timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    top = override.lstrip("+").split("=")[0].split(".")[0]
    line = one_error_line(out.stdout, f"train.py has no key {top}")
    assert (f"did you mean {nearest}?" in line) if nearest else ("did you mean" not in line)
    assert not (tmp_path / "run").exists()


def test_a_logger_whose_package_is_not_installed_is_one_line(tmp_path):
    import importlib.util

    if any(importlib.util.find_spec(p) for p in ("tensorboard", "tensorboardX")):
        pytest.skip("tensorboard is installed here: logger=tensorboard runs")
    out = run_cli(["logger=tensorboard", "debug=fast", f"hydra.run.dir={tmp_path}/run"], timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    assert 'logger=tensorboard needs the tensorboard package, which is not installed: pip install -e ".[tensorboard]"' \
        in out.stdout and "CONFIG" not in out.stdout and "Traceback" not in out.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("model", options("model"))
def test_every_model_builds_under_the_debug_presets(model, tmp_path):
    """debug=fast sizes every model's net (d_model, n_layers, n_heads): each family must accept it."""
    cfg = compose_train([f"model={model}", "debug=fast"], tmp_path)
    net = build_model(cfg.model).net
    assert sum(p.numel() for p in net.parameters()) < 500_000


@pytest.mark.parametrize("model", [f.name for f in families() if "attn" in f.groups])
def test_scaled_false_reaches_every_attention_of_every_transformer(model, tmp_path):
    """attn.scaled=false (claim E3's unscaled dot products) reaches every attention, self and cross."""
    def scales(*overrides: str) -> set[float]:
        net = build_model(compose_train([f"model={model}", "debug=fast", *overrides], tmp_path).model).net
        found = [m.scale for m in net.modules() if isinstance(m, MultiHeadAttention)]
        assert found, model
        return {round(s, 6) for s in found}

    head_dim = 32 // 2  # debug=fast: d_model 32, 2 heads
    assert scales() == {round(head_dim**-0.5, 6)}
    assert scales("attn.scaled=false") == {1.0}
