"""``train.py model=causal_lm init_from=<folder>`` on a language model folder as ``transformers`` writes it, with the
folder's own tokenizer: a GPT-2 (``<|endoftext|>`` its last id, tied, multi-head) and a LLaMA (``<unk> <s> </s>`` at
0-2, ``<s>`` put before a text, GQA, untied), built here at random initialisation (no download).

As a user meets it, through the entry points: the run trains on the corpus encoded as ``AutoTokenizer`` encodes it;
the run's checkpoint computes the library model's logits and, through ``generate``'s own sampling, greedily writes the
text the library's ``generate`` writes from the same prompt (a LLaMA's prompt starts with ``<s>``, as its tokenizer
puts it there); ``python -m attnlab.export format=hf`` gives back a folder with the same special ids, a tokenizer that
encodes as the original and the same logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from folder_tokenizers import library_folder
from helpers import run_cli, run_entry

transformers = pytest.importorskip("transformers")

ARGS = ["model=causal_lm", "debug=fast", "logger=csv", "callbacks.attention_maps=null",
        "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false", "data.seq_len=16",
        "trainer.max_steps=1", "model.optimizer.lr=1e-12", "test=false"]
TEXTS = ["The for statement", "def f(x):\n    return x", "  two  spaces", "ünïcödé — ΟΔΟΣ", ""]


def corpus_sample() -> list[str]:
    from attnlab.data.corpus import pydoc_text

    return [pydoc_text()[:200_000]]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_library_folder_with_its_own_tokenizer_trains_generates_and_exports_as_the_library_does(kind, tmp_path,
                                                                                                 cache_dir):
    from attnlab.cli.generate import load_task, sample_texts
    from attnlab.decoding import SamplingOptions

    folder = tmp_path / kind
    theirs = library_folder(kind, folder, corpus_sample())
    auto = transformers.AutoTokenizer.from_pretrained(folder)
    run = tmp_path / "run"
    out = run_cli([*ARGS, f"init_from={folder}", f"hydra.run.dir={run}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    ckpt = run / "checkpoints" / "last.ckpt"
    task, tok = load_task(ckpt)
    assert json.loads(torch.load(ckpt, weights_only=True)["tokenizer"]) == \
        json.loads((folder / "tokenizer.json").read_text())
    for text in TEXTS:  # the run's tokenizer encodes as the library's does, <s> included
        assert tok.encode(text) == auto(text)["input_ids"], text
    assert (tok.bos_id, tok.eos_id) == (theirs.config.bos_token_id, theirs.config.eos_token_id)

    ids = torch.randint(0, theirs.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (task.net(ids) - theirs(ids).logits).abs().max().item() <= 1e-5

    prompt = "The for statement"
    mine = sample_texts(task, tok, prompt, SamplingOptions(max_new_tokens=24, temperature=0), num_samples=1)[0]
    with torch.no_grad():
        hf_ids = theirs.generate(torch.tensor([auto(prompt)["input_ids"]]), max_new_tokens=24, do_sample=False,
                                 pad_token_id=auto.eos_token_id)
    assert mine == auto.decode(hf_ids[0], skip_special_tokens=True) and len(mine) > len(prompt), mine

    back = tmp_path / "back"
    out = run_entry(["-m", "attnlab.export", f"ckpt={ckpt}", f"out={back}", "format=hf"], cache_dir)
    assert out.returncode == 0 and f"the {kind} layout" in out.stdout, out.stdout[-3000:]
    config, original = (json.loads((f / "config.json").read_text()) for f in (back, folder))
    assert {k: config[k] for k in ("bos_token_id", "eos_token_id")} == \
        {k: original[k] for k in ("bos_token_id", "eos_token_id")}
    again = transformers.AutoTokenizer.from_pretrained(back)
    assert (again.bos_token, again.eos_token) == (auto.bos_token, auto.eos_token)
    assert all(again(t)["input_ids"] == auto(t)["input_ids"] for t in TEXTS)
    exported = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    with torch.no_grad():
        assert (exported(ids).logits - task.net(ids)).abs().max().item() <= 1e-5


def test_a_chat_models_folder_starts_a_run_that_ends_texts_at_its_tokenizers_end_token(tmp_path, cache_dir):
    """A chat model's folder (Qwen's way: config.json's eos is <|im_end|>, its tokenizer's end of text
    <|endoftext|>): the run starts, says in one warning which token ends its texts, and its tokenizer ends them
    there."""
    from attnlab.cli.generate import load_task

    folder = tmp_path / "chat"
    library_folder("chat", folder, corpus_sample())
    end, reply_end = (json.loads((folder / "tokenizer.json").read_text())["added_tokens"][i]["id"] for i in (0, 1))
    run = tmp_path / "run"
    out = run_cli([*ARGS, f"init_from={folder}", f"hydra.run.dir={run}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    assert f"its config.json ends a text with <|im_end|> (id {reply_end}); this run ends texts with its tokenizer's " \
           f"end token <|endoftext|> (id {end})" in out.stdout
    _, tok = load_task(run / "checkpoints" / "last.ckpt")
    assert tok.eos_id == end
