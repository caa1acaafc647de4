"""``train.py init_from=<folder>``: a new run that starts from a model folder's weights (a Hugging Face ViT that
``save_pretrained`` wrote, or an attnlab export), its parts and sizes from the folder (docs/weights.md).

Through train.py as a user runs it: the run starts from the folder's weights (one step at a learning rate of 1e-12
leaves them within 1e-6) and its checkpoint holds the folder's sizes; stopped after an epoch and resumed, it ends
bit for bit where the straight run ends; every contradiction is one line before torch, with no run folder left.
"""

from __future__ import annotations

import json

from pathlib import Path

import pytest
import torch
from cli_checks import one_error_line
from helpers import run_cli

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).parent / "fixtures"
VIT = ["model=vit", "debug=fast", "logger=csv", "callbacks.attention_maps=null", "callbacks.rich_progress_bar=null",
       "trainer.enable_progress_bar=false"]


@pytest.fixture(scope="module")
def library_vit(tmp_path_factory) -> Path:
    """What a researcher has: a ViT folder written by transformers (random weights, digits-sized)."""
    folder = tmp_path_factory.mktemp("library") / "vit"
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=72,
                                    image_size=8, patch_size=2, num_channels=1, num_labels=10)
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    return folder


def last_state(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)


def test_a_run_starts_from_the_library_folders_weights_and_sizes(library_vit, tmp_path, cache_dir):
    from attnlab.checkpoints.exported import read_hf

    run = tmp_path / "run"
    out = run_cli([*VIT, f"init_from={library_vit}", "trainer.max_steps=1", "model.optimizer.lr=1e-12", "test=false",
                   f"hydra.run.dir={run}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    ckpt = last_state(run)
    net = ckpt["hyper_parameters"]["net"]
    assert (net["d_model"], net["n_heads"], net["pool"]) == (32, 4, "cls")  # the folder's, not debug=fast's 2 heads
    _, theirs, _ = read_hf(library_vit)
    ours = {k.removeprefix("net."): v for k, v in ckpt["state_dict"].items()}
    assert ours.keys() == theirs.keys()
    assert all(torch.allclose(ours[k], theirs[k], atol=1e-6) for k in theirs)
    assert any(not torch.equal(ours[k], theirs[k]) for k in theirs)  # (one step was taken)


def test_an_init_from_run_resumes_exactly(library_vit, tmp_path, cache_dir):
    """One epoch, then resumed to two, ends where two straight epochs end (the schedule's length fixed, so that
    both runs follow one schedule: max_epochs=1 would otherwise plan a shorter one)."""
    common = [*VIT, f"init_from={library_vit}", "test=false", "+sched.total_steps=16"]
    straight, parts = tmp_path / "straight", tmp_path / "parts"
    assert run_cli([*common, "trainer.max_epochs=2", f"hydra.run.dir={straight}"], cache_dir).returncode == 0
    assert run_cli([*common, "trainer.max_epochs=1", f"hydra.run.dir={parts}"], cache_dir).returncode == 0
    out = run_cli([*common, "trainer.max_epochs=2", f"resume={parts}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    a, b = last_state(straight)["state_dict"], last_state(parts)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("fmt", ["safetensors", "hf"])
def test_a_language_model_run_starts_from_an_export_with_its_tokenizer(fmt, tmp_path, cache_dir):
    """The committed LM checkpoint exported (attnlab's folder, or the GPT-2 layout): the run's weights start as
    the checkpoint's, its data is encoded with the folder's tokenizer, and its checkpoint carries that tokenizer."""
    from attnlab.cli.export import export
    from attnlab.runs.load import load_task

    folder = tmp_path / "export"
    export(FIXTURES / "legacy_causal_lm.ckpt", folder, format=fmt)
    run = tmp_path / "run"
    out = run_cli(["model=causal_lm", *VIT[1:], f"init_from={folder}", "data.seq_len=16", "trainer.max_steps=1",
                   "model.optimizer.lr=1e-12", "test=false", f"hydra.run.dir={run}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    ckpt = last_state(run)
    assert ckpt["tokenizer"] == (folder / "tokenizer.json").read_text()
    task, _ = load_task(FIXTURES / "legacy_causal_lm.ckpt", "attnlab.tasks.base.Task", "attnlab")
    theirs = task.state_dict()
    assert ckpt["state_dict"].keys() == theirs.keys()
    assert all(torch.allclose(ckpt["state_dict"][k], theirs[k], atol=1e-6) for k in theirs)


def test_an_attnlab_export_starts_a_run(tmp_path, cache_dir):
    from attnlab.cli.export import export

    export(FIXTURES / "legacy_vit.ckpt", tmp_path / "export")
    out = run_cli([*VIT, f"init_from={tmp_path / 'export'}", "trainer.max_steps=2", "test=false",
                   f"hydra.run.dir={tmp_path / 'run'}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]


@pytest.mark.parametrize("case, expected", [
    ("size", "decides the model's parts and sizes (its config): drop model.net.d_model=64"),
    ("part", "decides the model's parts and sizes (its config): drop norm=rms"),
    ("data", "its image_size is 8, the data's (data.image_size) 16: give data.image_size=8"),
    ("family", "holds a VisionTransformer; model=causal_lm builds a CausalLM: choose its model="),
    ("with_ckpt_path", "give either init_from= (a model's weights) or ckpt_path= (a run's training state)"),
    ("missing", "no such folder"),
    ("not_a_model", "the folder holds neither attnlab.json (an attnlab export) nor config.json"),
    ("lm_seq_len", "its max_len is 16, the data's (data.seq_len) 32: give data.seq_len=16 or less"),  # (debug=fast's)
    ("lm_vocab", "decides the model's parts and sizes (its config): drop data.vocab_size=512"),
    ("lm_no_tokenizer", "no tokenizer.json: a language model's weights need the tokenizer they were trained with"),
    ("lm_no_end_token", "its tokenizer has no end-of-text token (one of <eos>, </s>, <|endoftext|>, <|end_of_text|>"),
    ("lm_config_disagrees", "its config.json gives eos_token_id=1, its tokenizer's eos token is id 2: they must agree"),
    ("bert_no_tokenizer", "no tokenizer.json: a language model's weights need the tokenizer they were trained with"),
    ("bert_no_mask_token", "its config.json has no attnlab counterpart: its tokenizer.json has no mask token ([MASK] "
                           "or <mask>)"),
    ("bert_damaged_tokenizer", "tokenizer.json cannot be read"),
    ("bert_as_causal_lm", "holds a MaskedLM; model=causal_lm builds a CausalLM: choose its model="),
])
def test_each_contradiction_is_one_line_before_anything_is_written(case, expected, library_vit, tmp_path,
                                                                   cache_dir):
    folder, extra = library_vit, []
    if case == "size":
        extra = ["model.net.d_model=64"]
    elif case == "part":
        extra = ["norm=rms"]
    elif case == "data":
        extra = ["data.image_size=16"]
    elif case == "family":
        extra = ["model=causal_lm"]
    elif case == "with_ckpt_path":
        extra = [f"ckpt_path={FIXTURES / 'legacy_vit.ckpt'}"]
    elif case == "missing":
        folder = tmp_path / "nothere"
    elif case == "not_a_model":
        folder = tmp_path / "empty"
        folder.mkdir()
    elif case.startswith("lm_"):
        from attnlab.cli.export import export

        folder = tmp_path / "lm"
        export(FIXTURES / "legacy_causal_lm.ckpt", folder, format="hf" if case == "lm_config_disagrees" else
               "safetensors")
        extra = ["model=causal_lm", *(["data.seq_len=16"] if case != "lm_seq_len" else [])]
        if case == "lm_vocab":
            extra.append("data.vocab_size=512")
        if case == "lm_no_tokenizer":
            (folder / "tokenizer.json").unlink()
        if case == "lm_no_end_token":  # a tokenizer that cannot say where a text ends
            text = (folder / "tokenizer.json").read_text()
            (folder / "tokenizer.json").write_text(text.replace('"<eos>"', '"<|im_start|>"'))
        if case == "lm_config_disagrees":
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 1}))
    elif case.startswith("bert_"):  # a BERT folder as transformers writes it, with its WordPiece tokenizer
        from folder_tokenizers import library_folder

        folder = tmp_path / "bert"
        library_folder("bert", folder, ["the for statement is a loop over the items of a sequence"] * 20)
        extra = ["model=causal_lm" if case == "bert_as_causal_lm" else "model=masked_lm", "data.seq_len=16"]
        tokenizer = folder / "tokenizer.json"
        if case == "bert_no_tokenizer":
            tokenizer.unlink()
        if case == "bert_no_mask_token":
            tokenizer.write_text(tokenizer.read_text().replace('"[MASK]"', '"[MAKS]"'))
        if case == "bert_damaged_tokenizer":
            tokenizer.write_text(tokenizer.read_text()[:100])
    args = [*VIT, f"init_from={folder}", *extra, f"hydra.run.dir={tmp_path / 'run'}"]
    out = run_cli([a for a in args if not (case == "family" or case.startswith(("lm_", "bert_"))) or a != "model=vit"],
                  cache_dir)
    assert out.returncode == 2, out.stdout[-2000:]
    one_error_line(out.stdout, expected)
    assert not (tmp_path / "run").exists()


def hub_cache(root: Path, repo: str, folder: Path) -> Path:
    """A Hugging Face hub cache holding ``folder`` as the snapshot of ``repo`` (the layout huggingface_hub reads:
    models--org--name/refs/main -> snapshots/<revision>/), so that no test touches the network."""
    import shutil

    revision = "0" * 40
    base = root / f"models--{repo.replace('/', '--')}"
    shutil.copytree(folder, base / "snapshots" / revision)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(revision)
    return root


def test_a_hub_id_is_read_from_the_local_cache_only(library_vit, tmp_path, cache_dir):
    """init_from=<org/name>: its snapshot in the local cache (HF_HUB_CACHE) starts the run; one that is not there
    is one line (nothing is downloaded: HF_HUB_OFFLINE is not even needed)."""
    from attnlab.checkpoints.exported import read_hf

    env = {"HF_HUB_CACHE": str(hub_cache(tmp_path / "hub", "acme/tiny-vit", library_vit))}
    run = tmp_path / "run"
    out = run_cli([*VIT, "init_from=acme/tiny-vit", "trainer.max_steps=1", "model.optimizer.lr=1e-12", "test=false",
                   f"hydra.run.dir={run}"], cache_dir, env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    ours = last_state(run)["state_dict"]
    _, theirs, _ = read_hf(library_vit)
    assert all(torch.allclose(ours[f"net.{k}"], v, atol=1e-6) for k, v in theirs.items())

    out = run_cli([*VIT, "init_from=acme/not-there", f"hydra.run.dir={tmp_path / 'none'}"], cache_dir, env=env)
    assert out.returncode == 2
    line = one_error_line(out.stdout, "acme/not-there")
    assert "no snapshot of acme/not-there in the local Hugging Face cache" in line
    assert "nothing is downloaded" in line and not (tmp_path / "none").exists()
