"""validate_config: every shipped model and experiment passes; a bad value of each model family is named with its key,
its value and what is allowed (the same check train.py runs first; tests/test_bad_inputs.py runs it for real)."""

from __future__ import annotations

import pytest
from helpers import compose_train

from attnlab.core.paths import CONF_DIR
from attnlab.core.errors import ConfigError
from attnlab.runs.validate import PRECISIONS, config_problems, validate_config


def names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


CHOICES = ([f"model={m}" for m in names("model")]
           + [f"model={m} debug=fast" for m in names("model")]  # the sizes the tests use
           + [f"experiment={e}" for e in names("experiment")]
           + [f"{group}={o}" for group in ("optim", "sched") for o in names(group)])


@pytest.mark.parametrize("choice", CHOICES)
def test_every_shipped_model_and_experiment_passes(choice, tmp_path):
    validate_config(compose_train(choice.split(), tmp_path))


@pytest.mark.parametrize("groups", [["moe=on"], ["pos=rotary"], ["ffn=swiglu", "norm=rms"], ["pos=sinusoidal"]])
def test_block_groups_as_shipped_pass(groups, tmp_path):
    for model in ("causal_lm", "transformer_mt", "sequence_classifier"):
        assert config_problems(compose_train([f"model={model}", *groups], tmp_path)) == [], (model, groups)


def problems(tmp_path, *overrides: str) -> list[str]:
    return config_problems(compose_train(list(overrides), tmp_path))


# (overrides, the one problem reported): at least a few keys of every model family
BAD = [
    # the language model
    (["model=causal_lm", "model.net.d_model=abc"], "model.net.d_model=abc: must be a positive integer"),
    (["model=causal_lm", "model.net.n_heads=0"], "model.net.n_heads=0: must be a positive integer"),
    (["model=causal_lm", "model.net.n_layers=0"], "model.net.n_layers=0: must be a positive integer"),
    (["model=causal_lm", "model.net.dropout=1.0"], "model.net.dropout=1.0: must be a number in [0, 1)"),
    (["model=causal_lm", "model.net.attn_dropout=-0.1"], "model.net.attn_dropout=-0.1: must be a number in [0, 1)"),
    (["model=causal_lm", "model.net.n_heads=5"],
     "model.net.d_model=192 is not divisible by model.net.n_heads=5 (each head gets d_model / n_heads dimensions)"),
    (["model=causal_lm", "model.optimizer.lr=-1"], "model.optimizer.lr=-1: must be a number > 0"),
    (["model=causal_lm", "model.optimizer.lr=0"], "model.optimizer.lr=0: must be a number > 0"),
    (["model=causal_lm", "model.optimizer.lr=nan"], "model.optimizer.lr=nan: must be a number > 0"),
    (["model=causal_lm", "model.optimizer.weight_decay=-0.1"],
     "model.optimizer.weight_decay=-0.1: must be a number >= 0"),
    (["model=causal_lm", "model.optimizer.betas=[0.9,1.0]"],
     "model.optimizer.betas=[0.9, 1.0]: must be two numbers in [0, 1), e.g. [0.9, 0.98]"),
    (["model=causal_lm", "model.scheduler.warmup_steps=-5"],
     "model.scheduler.warmup_steps=-5: must be an integer >= 0"),
    (["optim=sgd", "optim.momentum=1.0"], "optim.momentum=1.0: must be a number in [0, 1)"),
    (["optim=muon", "optim.lr=-1"], "optim.lr=-1: must be a number > 0"),  # an option's own value, set over its read
    (["sched=wsd", "sched.decay_fraction=1.5"], "sched.decay_fraction=1.5: must be a number in [0, 1]"),
    (["model=causal_lm", "data.batch_size=0"], "data.batch_size=0: must be a positive integer"),
    (["model=causal_lm", "data.seq_len=0"],  # model.net.max_len is ${data.seq_len}: both are named
     "model.net.max_len=0: must be a positive integer; data.seq_len=0: must be a positive integer"),
    (["model=causal_lm", "data.vocab_size=100"],
     "data.vocab_size=100: must be >= 260 for a byte-level BPE (4 special tokens + 256 bytes)"),
    (["model=causal_lm", "moe=on", "moe.num_experts=0"], "moe.num_experts=0: must be a positive integer"),
    (["model=causal_lm", "moe=on", "moe.top_k=0"], "moe.top_k=0: must be a positive integer"),
    (["model=causal_lm", "moe=on", "moe.top_k=9"],
     "moe.top_k=9 is more than moe.num_experts=8: each token picks top_k of the experts"),
    (["model=causal_lm", "moe=on", "moe.balance=sum"], "moe.balance=sum: choose one of layer, pooled"),
    (["model=causal_lm", "ffn.hidden_mult=0"], "ffn.hidden_mult=0: must be a number > 0"),
    (["model=causal_lm", "pos=rotary", "model.net.d_model=66", "model.net.n_heads=6"],
     "pos=rotary needs an even head dimension, but model.net.d_model=66 / model.net.n_heads=6 = 11"),
    (["model=causal_lm", "ffn.activation=tanh"], "ffn.activation=tanh: must be a module config such as "
     "{_target_: torch.nn.GELU, _partial_: true} (or choose ffn=" + "|".join(sorted(p.stem for p in (CONF_DIR / "ffn").glob("*.yaml")))
     + ")"),
    (["model=causal_lm", "attn.window=0"], "attn.window=0: must be a positive integer (or null)"),
    (["model=causal_lm", "attn=gqa", "attn.kv_heads=0"], "attn.kv_heads=0: must be a positive integer (or null)"),
    (["model=causal_lm", "model.net.n_heads=6", "attn.kv_heads=4"],
     "model.net.n_heads=6 is not divisible by attn.kv_heads=4 (grouped-query attention shares each key/value head "
     "among n_heads / kv_heads query heads)"),
    # transformer translation (and the non-autoregressive one)
    (["model=transformer_mt", "+model.net.n_encoder_layers=0"],
     "model.net.n_encoder_layers=0: must be a positive integer (or null)"),
    (["model=transformer_mt", "+model.net.n_decoder_layers=two"],
     "model.net.n_decoder_layers=two: must be a positive integer (or null)"),
    (["model=transformer_mt", "model.decoding.test.beam_size=0"],
     "model.decoding.test.beam_size=0: must be a positive integer"),
    (["model=transformer_mt", "model.label_smoothing=1"], "model.label_smoothing=1: must be a number in [0, 1)"),
    (["model=transformer_nat", "model.net.max_length_offset=-1"],
     "model.net.max_length_offset=-1: must be an integer >= 0"),
    (["model=transformer_mt", "data.target_lang=es"], "data.target_lang=es: choose one of fr, de"),
    (["model=transformer_mt", "data.max_digits=13"], "data.max_digits=13: must be an integer from 1 to 12"),
    # RNN translation
    (["model=seq2seq_attention", "model.net.d_hidden=0"], "model.net.d_hidden=0: must be a positive integer"),
    (["model=seq2seq_attention", "model.net.d_hidden=33"],
     "model.net.d_hidden=33 must be even (the bidirectional encoder runs d_hidden/2 per direction)"),
    (["model=seq2seq_baseline", "model.net.d_emb=-3"], "model.net.d_emb=-3: must be a positive integer"),
    (["model=seq2seq_attention", "model.cell=rnn"], "model.cell=rnn: choose one of gru, lstm"),
    (["model=seq2seq_attention", "model.attention=dot"],
     "model.attention=dot: choose one of none, bahdanau, luong_dot, luong_general"),
    (["model=seq2seq_attention", "model.scheduled_sampling.schedule=cosine"],
     "model.scheduled_sampling.schedule=cosine: choose one of none, constant, linear, exponential, inverse_sigmoid"),
    # the sequence classifier
    (["model=sequence_classifier", "model.net.kernel_size=0"], "model.net.kernel_size=0: must be a positive integer"),
    (["model=sequence_classifier", "model.encoder=rnn", "model.net.bidirectional=true", "model.net.d_model=63"],
     "model.net.d_model=63 must be even for a bidirectional GRU (d_model/2 per direction)"),  # n_heads: unused
    (["model=sequence_classifier", "model.net.d_model=63"],  # the attention encoder
     "model.net.d_model=63 is not divisible by model.net.n_heads=4 (each head gets d_model / n_heads dimensions)"),
    (["model=sequence_classifier", "model.encoder=lstm"], "model.encoder=lstm: choose one of rnn, cnn, attention"),
    # the Vision Transformer
    (["model=vit", "model.net.patch_size=3"],
     "model.net.image_size=8 is not divisible by model.net.patch_size=3 (the image is cut into patch_size × "
     "patch_size patches)"),
    (["model=vit", "data.image_size=16", "model.net.image_size=8"],
     "model.net.image_size=8 but data.image_size=16: the model is built for the images the data gives; set both "
     "alike (or leave model.net.image_size at its default ${data.image_size})"),
    (["model=vit", "model.net.in_channels=3"],
     "model.net.in_channels=3 but data.in_channels=1: the model is built for the images the data gives; set both "
     "alike (or leave model.net.in_channels at its default ${data.in_channels})"),
    # text to speech
    (["model=tts", "model.net.n_decoder_layers=0"], "model.net.n_decoder_layers=0: must be a positive integer (or null)"),
    (["model=tts", "model.net.reduction=0"], "model.net.reduction=0: must be a positive integer"),
    (["model=tts", "model.net.dec_prenet_dropout=1.5"], "model.net.dec_prenet_dropout=1.5: must be a number in [0, 1)"),
    (["model=tts", "model.net.enc_prenet_convs=-1"], "model.net.enc_prenet_convs=-1: must be an integer >= 0"),
    (["model=tts", "data.num_utterances=0"], "data.num_utterances=0: must be a positive integer"),
    # the LM's text data (a string reached LMDataModule's `>` comparison: Hydra's four-line error, exit 1)
    (["model=causal_lm", "data=text_file", "data.path=x", "data.tokenizer_sample_mb=abc"],
     "data.tokenizer_sample_mb=abc: must be a number > 0"),
    (["model=causal_lm", "data.val_fraction=1.5"], "data.val_fraction=1.5: must be a number in [0, 1)"),
    # training
    (["trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches=0: must be a positive integer"),
    (["trainer.max_epochs=-5"], "trainer.max_epochs=-5: must be an integer >= -1 (or null)"),
    (["trainer.max_steps=1.5"], "trainer.max_steps=1.5: must be an integer >= -1 (or null)"),
    (["precision=17"], "trainer.precision=17: choose one of " + ", ".join(map(str, PRECISIONS))),
]


def test_the_precision_list_is_lightnings():
    import typing

    from lightning.fabric.connector import _PRECISION_INPUT

    def leaves(t):
        args = typing.get_args(t)
        return [x for a in args for x in leaves(a)] if args and not isinstance(args[0], (str, int)) else list(args)

    assert sorted(map(str, leaves(_PRECISION_INPUT))) == sorted(map(str, PRECISIONS))


@pytest.mark.parametrize("overrides,expected", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_a_bad_value_is_named_with_what_is_allowed(overrides, expected, tmp_path):
    with pytest.raises(ConfigError) as e:
        validate_config(compose_train(overrides, tmp_path))
    assert str(e.value) == expected and "\n" not in str(e.value)


def test_every_bad_value_is_named_on_one_line(tmp_path):
    cfg = compose_train(["model=causal_lm", "model.net.n_heads=0", "model.optimizer.lr=-1"], tmp_path)
    with pytest.raises(ConfigError, match=r"^model\.net\.n_heads=0: must be a positive integer; "
                                          r"model\.optimizer\.lr=-1: must be a number > 0$"):
        validate_config(cfg)


def test_groups_a_model_is_not_built_from_are_not_checked(tmp_path):
    # the RNN is built from no block group, and a mixture that is off is not used: neither can break the run
    assert problems(tmp_path, "model=seq2seq_attention", "ffn.hidden_mult=0", "attn.window=0") == []
    assert problems(tmp_path, "model=sequence_classifier", "model.encoder=cnn", "attn.window=0") == []
    assert problems(tmp_path, "model=causal_lm", "moe=on", "moe.top_k=0") == ["moe.top_k=0: must be a positive integer"]


def test_lr_inf_is_let_through_for_the_divergence_guard(tmp_path):
    assert problems(tmp_path, "model=seq2seq_attention", "model.optimizer.lr=inf") == []


def test_a_missing_mandatory_value_is_named(tmp_path):
    assert problems(tmp_path, "data=tsv") == ["data.path is not set: give it on the command line (data.path=...)"]
    assert problems(tmp_path, "data=tsv", "data.path=/some/file.tsv") == []


@pytest.mark.parametrize("overrides,expected", [
    (["optim=sgd", "model.optimizer.betas=[0.8,0.9]"], "model.optimizer.betas=[0.8,0.9]: optim=sgd does not read "
     "model.optimizer.betas (it reads model.optimizer.lr, model.optimizer.weight_decay); its own arguments are "
     "optim.<name>=..."),
    # the schedule's length is the sched option's own argument
    (["+model.scheduler.total_steps=12"], "+model.scheduler.total_steps=12: sched=cosine does not read "
     "model.scheduler.total_steps (it reads model.scheduler.min_lr_ratio, model.scheduler.warmup_steps); give it as "
     "+sched.total_steps=12"),
])
def test_a_model_value_the_chosen_option_does_not_read_is_refused(overrides, expected, tmp_path):
    with pytest.raises(ConfigError) as e:
        validate_config(compose_train(overrides, tmp_path), overrides)
    assert str(e.value) == expected
    validate_config(compose_train(["optim=sgd", "model.optimizer.lr=0.1"], tmp_path), ["model.optimizer.lr=0.1"])
