"""Checkpoints written before parts-from-config and the one naming scheme still load, through the entry
points people run, and a run resumes from one (weights and optimizer state).

``tests/fixtures/legacy_{lm_parts,mt_copy,nat,vit,cls,tts}.ckpt`` were written by train.py at be874d7, the commit
before the change (tiny models, 2 steps), e.g.
    python train.py model=causal_lm debug=fast trainer.max_steps=2 test=false model.net.d_model=16 \\
        model.net.n_layers=1 norm=rms ffn=swiglu moe=on moe.num_experts=2 pos=rotary data.vocab_size=300 data.seq_len=16
    python train.py model=transformer_mt ... model.net.copy=true norm=post pos=sinusoidal
    python train.py model=vit ... model.net.pool=cls      (and transformer_nat, sequence_classifier, tts)
so between them they hold every old spec (norm/ffn/moe/pos), both position tables and every renamed stack.
"""

from __future__ import annotations

import pytest
import torch
from test_safe_checkpoints import FIXTURES, QUIET, cli

from attnlab.checkpoints.upgrade import upgrade_net_config, upgrade_state_dict
from attnlab.runs.load import load_task
from attnlab.checkpoints.read import read_checkpoint
from attnlab.decoding.tts import generate_mel
from attnlab.modules.moe import MixtureOfExperts
from attnlab.modules.positional import RotaryPositions, SinusoidalPositions
from attnlab.tasks.base import Task

LEGACY = {name: FIXTURES / f"legacy_{name}.ckpt" for name in ("lm_parts", "mt_copy", "nat", "vit", "cls", "tts")}


def test_every_legacy_checkpoint_loads_strictly_into_todays_model():
    for name, path in LEGACY.items():
        assert path.stat().st_size < 2_500_000, name
        raw = read_checkpoint(path)
        old_keys = [k for k in raw["state_dict"] if k.startswith("net.")]
        task, _ = load_task(path, Task, "attnlab")  # strict load_state_dict: every key found, every shape right
        new_keys = [f"net.{k}" for k in task.net.state_dict()]
        assert len(new_keys) == len(old_keys), name
        for old, new in zip(old_keys, new_keys):  # same tensors in the same order: only the names moved
            assert torch.equal(raw["state_dict"][old].reshape(-1),
                               task.net.state_dict()[new.removeprefix("net.")].reshape(-1)), (name, old, new)


def test_old_specs_become_the_parts_they_meant():
    net = load_task(LEGACY["lm_parts"], Task, "attnlab")[0].net  # norm=rms ffn=swiglu moe=on(2) pos=rotary
    layer = net.decoder.layers[0]
    assert isinstance(layer.sa_norm, torch.nn.RMSNorm) and layer.pre_norm
    assert isinstance(layer.ffn, MixtureOfExperts) and layer.ffn.num_experts == 2
    assert all(e.gate_proj is not None and isinstance(e.activation, torch.nn.SiLU) for e in layer.ffn.experts)
    # trained with the biased SwiGLU of then: loads with its biases although ffn=swiglu is bias-free today
    assert all(lin.bias is not None for e in layer.ffn.experts for lin in (e.up_proj, e.gate_proj, e.down_proj))
    assert isinstance(net.positions, RotaryPositions) and layer.self_attn.positions is net.positions.attention
    mt = load_task(LEGACY["mt_copy"], Task, "attnlab")[0].net  # norm=post pos=sinusoidal copy=true
    assert mt.copy and isinstance(mt.src_positions, SinusoidalPositions)
    assert not any(layer.pre_norm for layer in [*mt.encoder.layers, *mt.decoder.layers])
    assert isinstance(mt.decoder.final_norm, torch.nn.Identity)


def swiglu_checkpoint(tmp_path, spec_form: bool, drop_bias: bool = False):
    """The SwiGLU LM of ``legacy_lm_parts.ckpt`` as a checkpoint of either layout from before SwiGLU became
    bias-free: the old spec form (``ffn: {activation: swiglu, ...}``), or the parts form train.py wrote with the
    old conf/ffn/swiglu.yaml (``bias: true``) and today's key names; optionally without the ``bias`` key."""
    raw = read_checkpoint(LEGACY["lm_parts"])
    net = raw["hyper_parameters"]["net"]
    if not spec_form:
        net = raw["hyper_parameters"]["net"] = upgrade_net_config(net)
        assert net["ffn"]["bias"] is True and net["ffn"]["gated"] is True
        upgrade_state_dict(raw["state_dict"], net["_target_"])
    if drop_bias:
        del net["ffn"]["bias"]
    torch.save(raw, tmp_path / "old_swiglu.ckpt")
    return tmp_path / "old_swiglu.ckpt", raw


@pytest.mark.parametrize("spec_form, drop_bias", [(True, False), (True, True), (False, False)])
def test_swiglu_checkpoints_from_before_bias_free_load_with_their_biases(tmp_path, spec_form, drop_bias):
    path, raw = swiglu_checkpoint(tmp_path, spec_form, drop_bias)
    task, _ = load_task(path, Task, "attnlab")  # strict: the bias tensors must find a home
    experts = task.net.decoder.layers[0].ffn.experts
    assert all(lin.bias is not None for e in experts for lin in (e.up_proj, e.gate_proj, e.down_proj))
    state = task.net.state_dict()
    old = {k.removeprefix("net."): v for k, v in raw["state_dict"].items() if k.startswith("net.")}
    if spec_form:
        upgrade_state_dict(old, raw["hyper_parameters"]["net"]["_target_"], prefix="")
    assert state.keys() == old.keys() and all(torch.equal(state[k], old[k]) for k in state)


def test_a_tts_checkpoint_from_before_text_eos_reads_its_text_without_eos():
    """text_eos is on by default; a net config without it was trained without <eos> and keeps that."""
    task = load_task(LEGACY["tts"], Task, "attnlab")[0]
    assert task.net.text_eos is False and task.net.max_chars == task.net.max_text_len
    text = torch.tensor([[5, 6, 7, 8]])
    gen = generate_mel(task.net, text, torch.tensor([4]), max_frames_per_char=1.0)
    assert gen.attention[0].shape[-1] == 4 and gen.text_lengths.tolist() == [4]
    cfg = {"_target_": "attnlab.models.tts.TransformerTTS", "vocab_size": 51}
    assert upgrade_net_config(cfg)["text_eos"] is False
    assert upgrade_net_config({**cfg, "text_eos": True})["text_eos"] is True
    assert "text_eos" not in upgrade_net_config({"_target_": "attnlab.models.causal_lm.CausalLM"})


def test_upgrading_is_idempotent_and_leaves_todays_checkpoints_alone():
    raw = read_checkpoint(LEGACY["vit"])
    cfg = upgrade_net_config(raw["hyper_parameters"]["net"])
    assert upgrade_net_config(cfg) == cfg and "scaled" not in cfg
    state = dict(raw["state_dict"])
    assert upgrade_state_dict(state, cfg["_target_"]) is True
    assert state["net.positions.table"].dim() == 2 and "net.pos_embed" not in state
    assert upgrade_state_dict(state, cfg["_target_"]) is False


@pytest.mark.slow  # the same loader as the strict test above; generate/translate of old checkpoints run by default
def test_legacy_checkpoints_serve_translate_and_synthesize(tmp_path, cache_dir):
    """(generate.py and translate.py with an old LM and MT checkpoint: tests/test_safe_checkpoints.py)"""
    tr = cli("translate.py", f"ckpt={LEGACY['nat']}", f"hydra.run.dir={tmp_path / 't'}", stdin="twenty-one\nseven\n",
             cache_dir=cache_dir)
    assert tr.returncode == 0 and len(tr.stdout.splitlines()) == 2, tr.stderr[-3000:]
    sy = cli("synthesize.py", f"ckpt={LEGACY['tts']}", "text=one two", "griffin_lim_iters=2", "max_frames_per_char=2",
             f"out_dir={tmp_path / 'wav'}", f"hydra.run.dir={tmp_path / 's'}", cache_dir=cache_dir)
    assert sy.returncode == 0, sy.stderr[-3000:]
    assert list((tmp_path / "wav").glob("*.wav"))


def test_a_run_continues_from_a_legacy_checkpoint(tmp_path, cache_dir):
    """trainer.fit(ckpt_path=old) restores weights and the AdamW state (same parameter order) and trains on."""
    out = cli("train.py", "model=vit", "debug=fast", "model.net.d_model=16", "model.net.n_layers=1",
              "model.net.pool=cls", f"ckpt_path={LEGACY['vit']}", "trainer.max_epochs=2", "trainer.max_steps=4",
              "test=false", *QUIET,
              f"hydra.run.dir={tmp_path / 'run'}", cache_dir=cache_dir)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    resumed = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert resumed["global_step"] == 4 and "net.encoder.layers.0.self_attn.qkv_proj.weight" in resumed["state_dict"]


# where each moved target sits in a saved run config: (path to its node, the rest of that node)
MOVED_PLACES = {"attnlab.data.hf_source.hf_datamodule": (("data",), {"path": "x", "seed": "${hydra:runtime.cwd}"}),
                "attnlab.utils.checkpoint_io.AtomicCheckpointIO": (("trainer", "plugins", 0), {})}


def test_every_moved_target_has_its_place_in_the_test():
    from attnlab.checkpoints.upgrade import MOVED_TARGETS

    assert set(MOVED_TARGETS) == set(MOVED_PLACES)


@pytest.mark.parametrize("old", sorted(MOVED_PLACES))
def test_a_saved_run_config_naming_a_moved_target_reads_as_its_new_place(tmp_path, old):
    """A run folder saved before a class or function moved (``data=hf``'s builder, the trainer's checkpoint writer)
    still passes the allow-list and builds the same thing; the data compares as the same for resume=; each old
    name is gone and each new one resolves."""
    import hydra
    from omegaconf import OmegaConf

    from attnlab.checkpoints.allowed_targets import load_config
    from attnlab.checkpoints.upgrade import MOVED_TARGETS
    from attnlab.runs import resume

    new = MOVED_TARGETS[old]
    assert callable(hydra.utils.get_object(new))
    with pytest.raises(Exception):
        hydra.utils.get_object(old)
    place, rest = MOVED_PLACES[old]

    def config_with(target):
        node = {"_target_": target, **rest}
        for key in reversed(place):
            node = [node] if isinstance(key, int) else {key: node}
        return {**node, "model": {"name": "causal_lm"}}

    def target_in(config):
        node = config
        for key in place:
            node = node[key]
        return node["_target_"]

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    saved = run / ".hydra" / "config.yaml"
    saved.write_text(OmegaConf.to_yaml(config_with(old)))
    assert target_in(load_config(saved)) == new
    assert target_in(resume.saved_config(run)) == new
    if place == ("data",):
        here = OmegaConf.create(config_with(new)["data"])
        assert resume.data_differences(OmegaConf.load(saved).data, here)  # as written, it differs
        assert resume.data_differences(resume.saved_config(run).data, here) == []
