"""``python -m attnlab.export format=hf``: a causal language model as a Hugging Face ``transformers`` folder that
``AutoModelForCausalLM.from_pretrained`` loads with no attnlab code (docs/weights.md).

A round trip is a property, tested over its space on tiny models built from the configs (no download): every
layout x {multi-head, GQA, MQA where the layout has them} x {tied, untied} x {fp32, bf16}: no missing, unexpected
or mismatched keys; logits within 1e-5 of attnlab's (fp32; bf16: attnlab's model with the same rounded weights);
greedy generation of 32 tokens identical to attnlab's; the dtype on disk the one asked. Each planted converter bug
(q/k rows permuted as for Meta's interleaved rotary, the tie dropped, GQA's key/value heads reordered, GPT-2's
transpose forgotten) makes that check fail.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from cli_checks import one_error_line
from helpers import compose_train, perturbed_task
from omegaconf import OmegaConf

transformers = pytest.importorskip("transformers")  # the weights extra (.[dev] includes it)

from attnlab.checkpoints import hf_layouts  # noqa: E402
from attnlab.checkpoints.exported import write_hf  # noqa: E402
from attnlab.cli.export import export  # noqa: E402
from attnlab.core.errors import OptionError  # noqa: E402
from attnlab.core.special_tokens import EOS_ID  # noqa: E402
from attnlab.decoding import CausalLMStepper, SamplingOptions, generate  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
V, T = 64, 48
LAYOUT_PARTS = {"gpt2": [], "llama": ["norm=rms", "ffn=swiglu", "pos=rotary", "model.net.bias=false"],
                "qwen3": ["norm=rms", "ffn=swiglu", "pos=rotary", "model.net.bias=false", "attn.qk_norm=true",
                          "attn.qk_norm_eps=1e-5"],
                "mixtral": ["norm=rms", "ffn=swiglu", "pos=rotary", "model.net.bias=false", "moe=on",
                            "moe.num_experts=4", "moe.top_k=2"]}
HEADS = {"mha": ["attn=mha"], "gqa": ["attn=gqa", "attn.kv_heads=2"], "mqa": ["attn=mqa"]}
CASES = [(layout, heads, tied, dtype) for layout in LAYOUT_PARTS for heads in HEADS
         for tied in (True, False) for dtype in ("fp32", "bf16") if layout != "gpt2" or heads == "mha"]


def tiny(layout: str, heads: str, tied: bool, tmp_path: Path):
    """A CausalLM task at random initialization (seeded), in ``layout``'s parts, and its checkpoint contents."""
    cfg = compose_train(["model=causal_lm", "model.net.d_model=32", "model.net.n_heads=4", "model.net.n_layers=2",
                         f"model.net.max_len={T}", f"model.net.vocab_size={V}", "model.net.dropout=0.0",
                         f"model.net.tie_embeddings={str(tied).lower()}", *LAYOUT_PARTS[layout], *HEADS[heads]],
                        tmp_path / "cfg")
    return perturbed_task(cfg)


def rounded(task, dtype: str):
    """attnlab's model with its weights as the export stores them (bf16: rounded), in fp32."""
    if dtype == "bf16":
        with torch.no_grad():
            for p in task.parameters():
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
    return task


def check_round_trip(task, out: Path, dtype: str) -> None:
    """The folder loads in transformers with every key in place and computes what attnlab's model computes."""
    from safetensors import safe_open

    hf, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, dtype=torch.float32)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    hf.eval()
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {{"fp32": "F32", "bf16": "BF16"}[dtype]}
    net = rounded(task, dtype).net
    ids = torch.randint(0, V, (3, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = net(ids), hf(ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-5, (ours - theirs).abs().max().item()
    prompt = ids[:1, :8]
    # greedy, both stopping at <eos> (the folder's generation_config.json names it, as attnlab's generate stops)
    mine = generate(CausalLMStepper(net, True), prompt, SamplingOptions(max_new_tokens=32, temperature=0),
                    eos_id=EOS_ID)
    with torch.no_grad():
        hfs = hf.generate(prompt, max_new_tokens=32, do_sample=False)
    assert torch.equal(mine, hfs) and mine.shape[1] > prompt.shape[1], (mine, hfs)


@pytest.mark.parametrize("layout, heads, tied, dtype", CASES)
def test_export_loads_in_transformers_with_the_same_logits_and_generation(layout, heads, tied, dtype, tmp_path):
    task, contents = tiny(layout, heads, tied, tmp_path)
    out = tmp_path / "hf"
    files, chosen = write_hf(contents, out, "auto", dtype)
    assert chosen == layout
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied and config["dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[dtype]
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert ("lm_head.weight" in f.keys()) is (not tied)  # tied: transformers ties it on load, as it saves it
    check_round_trip(task, out, dtype)


def _permute_qk_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Meta's interleaved rotary layout: each head's rows (d/2 pairs) reordered as Meta <-> HF converters do."""
    rows, cols = t.shape
    return t.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


PLANTED = {
    "qk_not_permuted_right": ("llama", "gqa", True, lambda t: {
        k: _permute_qk_rows(v, 4 if "q_proj" in k else 2) if ("q_proj" in k or "k_proj" in k) and v.dim() == 2 else v
        for k, v in t.items()}),
    "tie_dropped": ("gpt2", "mha", False, lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"}),
    "gqa_heads_reordered": ("llama", "gqa", True, lambda t: {
        k: torch.cat(v.chunk(2, dim=0)[::-1]) if ("k_proj" in k or "v_proj" in k) else v for k, v in t.items()}),
    "gpt2_not_transposed": ("gpt2", "mha", True, lambda t: {
        k: v.t().contiguous().view(v.shape) if k.endswith("c_fc.weight") else v for k, v in t.items()}),
}


@pytest.mark.parametrize("bug", PLANTED)
def test_each_planted_converter_bug_fails_the_round_trip(bug, tmp_path, monkeypatch):
    layout, heads, tied, plant = PLANTED[bug]
    task, contents = tiny(layout, heads, tied, tmp_path)
    real = hf_layouts.hf_tensors
    import attnlab.checkpoints.hf_layouts as module

    monkeypatch.setattr(module, "hf_tensors", lambda *a: plant(real(*a)))
    write_hf(contents, tmp_path / "hf", "auto", "fp32")
    with pytest.raises(AssertionError):
        check_round_trip(task, tmp_path / "hf", "fp32")


def test_the_tokenizer_goes_along_and_encodes_as_attnlab_does(tmp_path):
    """A trained checkpoint (the committed LM fixture) through the command's own function: AutoTokenizer reads the
    folder and gives attnlab's ids for any text."""
    from attnlab.runs.load import load_task

    out = tmp_path / "hf"
    export(FIXTURES / "legacy_causal_lm.ckpt", out, format="hf")
    task, _ = load_task(FIXTURES / "legacy_causal_lm.ckpt", "attnlab.tasks.base.Task", "attnlab")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    for text in ("The for statement", "def f(x):\n    return x  # ünïcödé", "", "  two  spaces"):
        assert tok(text)["input_ids"] == task.tokenizer.encode(text), text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)


@pytest.mark.parametrize("parts, layout, expected", [
    (["norm=post"], "gpt2", "layout=gpt2 does not fit this model: norm=post"),
    (["pos=alibi"], "auto", "this model fits none of the layouts"),
    (["attn.window=4"], "llama", "attn.window=4"),
    (["moe=on"], "auto", "moe=on"),
    (["norm=rms", "ffn=swiglu", "pos=rotary", "model.net.bias=false", "moe=on", "moe.top_k=1"], "mixtral",
     "moe.top_k=1 (attnlab keeps the raw probability at k=1, Mixtral renormalizes it to 1)"),
    (["attn.qk_norm=true", "norm=rms", "ffn=swiglu", "pos=rotary"], "llama", "attn.qk_norm=true"),
    (["attn.qk_norm=true", "norm=rms", "ffn=swiglu", "pos=rotary"], "qwen3",
     "attn.qk_norm_eps=None (Qwen3: the norms' eps, 1e-05)"),
    (["norm=rms", "ffn=swiglu", "pos=rotary"], "qwen3", "attn.qk_norm=false (Qwen3 normalizes q and k)"),
    (["norm=rms", "ffn=swiglu", "pos=rotary"], "gpt2", "it fits llama"),
    (["attn=gqa"], "gpt2", "attn.kv_heads=2 (GPT-2: multi-head only)"),
    (["attn=gqa"], "vit", "layout=vit holds another kind of model; this one's: gpt2, llama"),
])
def test_a_model_whose_parts_do_not_fit_is_one_line_and_nothing_is_written(parts, layout, expected, tmp_path):
    cfg = compose_train(["model=causal_lm", "model.net.d_model=32", "model.net.n_heads=4", "model.net.n_layers=1",
                         *parts], tmp_path / "cfg")
    contents = {"hyper_parameters": {"net": OmegaConf.to_container(cfg.model.net, resolve=True)}, "state_dict": {}}
    with pytest.raises(OptionError, match=expected.replace("(", r"\(").replace(")", r"\)")) as e:
        write_hf(contents, tmp_path / "hf", layout)
    assert "\n" not in str(e.value) and not (tmp_path / "hf").exists()


def test_another_family_through_the_command_is_one_line(tmp_path, cache_dir):
    from helpers import run_entry

    out = run_entry(["-m", "attnlab.export", f"ckpt={FIXTURES / 'legacy_tts.ckpt'}", f"out={tmp_path / 'hf'}",
                     "format=hf", f"hydra.run.dir={tmp_path / 'run'}"], cache_dir)
    assert out.returncode == 2
    assert ("format=hf takes a causal language model (model=causal_lm), a masked one (model=masked_lm) or a ViT "
            "(model=vit); this is TransformerTTS") in one_error_line(out.stdout, "format=hf")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "run").exists()


def library_model(layout: str, heads: str, tied: bool):
    """A randomly initialised transformers model of ``layout`` (what a researcher has in a folder)."""
    torch.manual_seed(0)
    if layout == "gpt2":
        config = transformers.GPT2Config(vocab_size=V, n_positions=T, n_embd=32, n_layer=2, n_head=4,
                                         tie_word_embeddings=tied, activation_function="gelu_new")
    else:
        kv = {"mha": 4, "gqa": 2, "mqa": 1}[heads]
        kind = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config,
                "mixtral": transformers.MixtralConfig}[layout]
        extra = {"num_local_experts": 4, "num_experts_per_tok": 2} if layout == "mixtral" else {}
        config = kind(vocab_size=V, hidden_size=32, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=kv, max_position_embeddings=T, tie_word_embeddings=tied, rms_norm_eps=1e-6,
                      head_dim=8, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms off their ones, so that a misplaced one shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("layout, heads, tied", sorted({c[:3] for c in CASES}))
def test_a_folder_the_library_wrote_reads_into_attnlab_and_exports_back_bit_for_bit(layout, heads, tied, tmp_path):
    """save_pretrained of a random transformers model -> attnlab's net (its parts and sizes from config.json):
    logits equal the library's; exported again, the same tensors bit for bit and no key more or less."""
    import hydra
    from safetensors.torch import load_file

    from attnlab.checkpoints.exported import read_hf

    theirs = library_model(layout, heads, tied)
    theirs.save_pretrained(tmp_path / "library")
    net_cfg, state, read_layout = read_hf(tmp_path / "library")
    assert read_layout == layout and hf_layouts.fitting_layouts(net_cfg)[0] == layout
    net = hydra.utils.instantiate(net_cfg, _convert_="all").eval()
    net.load_state_dict(state, strict=True)
    ids = torch.randint(0, V, (3, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (net(ids) - theirs(ids).logits).abs().max().item() <= 1e-5

    contents = {"hyper_parameters": {"net": net_cfg},
                "state_dict": {f"net.{k}": v for k, v in net.state_dict().items()}}
    write_hf(contents, tmp_path / "again", layout)
    saved, again = load_file(str(tmp_path / "library" / "model.safetensors")), load_file(str(tmp_path / "again" /
                                                                                             "model.safetensors"))
    assert saved.keys() == again.keys()
    assert all(torch.equal(saved[k], again[k]) for k in saved)


@pytest.mark.parametrize("change, expected", [
    ({"model_type": "mistral"}, "has no attnlab counterpart: model_type='mistral'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "rope_type=llama3"),
    ({"hidden_act": "tanh"}, "activation 'tanh'"),
])
def test_a_folder_without_a_counterpart_is_one_line(change, expected, tmp_path):
    from attnlab.checkpoints.exported import read_hf
    from attnlab.core.errors import CheckpointError

    library_model("llama", "gqa", True).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=re.escape(expected)) as e:
        read_hf(tmp_path)
    assert "\n" not in str(e.value)


def tiny_vit(tmp_path: Path, extra: list[str] = ()):
    cfg = compose_train(["model=vit", "model.net.pool=cls", "model.net.d_model=32", "model.net.n_layers=2",
                         "model.net.dropout=0.0", *extra], tmp_path / "cfg")
    return perturbed_task(cfg)


IMAGES = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_vit_exports_as_vit_for_image_classification(dtype, tmp_path):
    task, contents = tiny_vit(tmp_path)
    _, layout = write_hf(contents, tmp_path / "hf", "auto", dtype)
    assert layout == "vit"
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["layer_norm_eps"] == 1e-5  # (transformers' ViT default is 1e-12)
    hf, info = transformers.AutoModelForImageClassification.from_pretrained(tmp_path / "hf", output_loading_info=True,
                                                                            dtype=torch.float32)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    net = rounded(task, dtype).net
    with torch.no_grad():
        assert (net(IMAGES) - hf.eval()(IMAGES).logits).abs().max().item() <= 1e-5


def test_a_vit_the_library_wrote_reads_into_attnlab_and_exports_back_bit_for_bit(tmp_path):
    import hydra
    from safetensors.torch import load_file

    from attnlab.checkpoints.exported import read_hf

    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=72,
                                    image_size=8, patch_size=2, num_channels=1, num_labels=10)
    theirs = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    theirs.save_pretrained(tmp_path / "library")
    net_cfg, state, layout = read_hf(tmp_path / "library")
    net = hydra.utils.instantiate(net_cfg, _convert_="all").eval()
    net.load_state_dict(state, strict=True)
    with torch.no_grad():
        assert (net(IMAGES) - theirs(IMAGES).logits).abs().max().item() <= 1e-5
    write_hf({"hyper_parameters": {"net": net_cfg}, "state_dict": {f"net.{k}": v for k, v in net.state_dict().items()}},
             tmp_path / "again", layout)
    saved, again = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("library", "again"))
    assert saved.keys() == again.keys() and all(torch.equal(saved[k], again[k]) for k in saved)


@pytest.mark.parametrize("extra, expected", [
    (["model.net.pool=mean"], "model.net.pool=mean (ViTForImageClassification reads the class token: pool=cls)"),
    (["pos=sinusoidal"], "pos=SinusoidalPositions (ViT: learned positions)"),
    (["norm=rms"], "(ViT: LayerNorm)"),
])
def test_a_vit_whose_parts_do_not_fit_is_one_line(extra, expected, tmp_path):
    _, contents = tiny_vit(tmp_path, extra)
    with pytest.raises(OptionError, match=re.escape(expected)):
        write_hf(contents, tmp_path / "hf", "auto")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("layout, parts", [("gpt2", []), ("llama", LAYOUT_PARTS["llama"] + ["attn=gqa"])])
def test_a_trained_run_exports_through_the_command_and_transformers_computes_the_same(layout, parts, tmp_path,
                                                                                      cache_dir):
    """As a user runs it: train.py (debug=fast, a few steps) -> python -m attnlab.export format=hf -> transformers'
    logits equal attnlab's on the run's own checkpoint."""
    from cli_checks import TINY
    from helpers import run_cli
    from helpers import run_entry

    from attnlab.runs.load import load_task

    run = tmp_path / "run"
    out = run_cli([*TINY, *parts, f"hydra.run.dir={run}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    ckpt = run / "checkpoints" / "last.ckpt"
    out = run_entry(["-m", "attnlab.export", f"ckpt={ckpt}", f"out={tmp_path / 'hf'}", "format=hf"], cache_dir)
    assert out.returncode == 0 and f"the {layout} layout" in out.stdout, out.stdout[-3000:]
    task, _ = load_task(ckpt, "attnlab.tasks.causal_lm.CausalLMTask", "language-model")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ids = torch.randint(0, task.net.embed.num_embeddings, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (task.net(ids) - hf(ids).logits).abs().max().item() <= 1e-5


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/tmp/outside.safetensors", "sub/model.safetensors",
                                   "..", "file:model.safetensors"])
def test_a_shard_index_naming_a_file_outside_its_folder_is_refused(shard, tmp_path):
    """model.safetensors.index.json is data: its shard names are plain names inside the folder, nothing else is
    opened (the outside file here is a genuine shard that would load)."""
    from attnlab.checkpoints.exported import read_hf
    from attnlab.core.errors import CheckpointError

    folder = tmp_path / "library"
    library_model("llama", "gqa", True).save_pretrained(folder)
    (tmp_path / "outside.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": shard}}))
    with pytest.raises(CheckpointError, match=re.escape(f"names a shard outside its folder: {shard!r}")):
        read_hf(folder)
