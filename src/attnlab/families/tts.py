"""Transformer-TTS with guided attention: ``model=tts``, speech, served by ``synthesize.py``."""

from __future__ import annotations

from ..core.value_checks import non_negative_int, optional, positive_int, probability, table_rules
from . import Family


def batch_loss(net, gen):
    import torch
    import torch.nn.functional as F

    text = torch.randint(1, net.vocab_size, (2, 8), generator=gen)
    mel = torch.randn(2, 9, net.n_mels, generator=gen)
    out = net(text, torch.full((2,), 8), mel)
    return F.l1_loss(out["mel_after"], mel)


FAMILY = Family(
    name="tts",
    task="attnlab.tasks.tts.TTSTask",
    net="attnlab.models.tts.TransformerTTS",
    data="speech",
    groups=("norm", "ffn", "moe", "attn"),  # its scaled sinusoidal positions are part of the model
    what="a text-to-speech model",
    serves="synthesize.py",
    description="Transformer-TTS: characters to mel frames to Griffin-Lim audio, with guided attention",
    rules=table_rules([
        *((f"model.net.{k}", positive_int) for k in ("n_mels", "reduction", "dec_prenet_dim", "postnet_channels",
                                                     "postnet_layers", "max_text_len", "max_dec_steps")),
        ("model.net.enc_prenet_convs", non_negative_int),
        ("model.net.dec_prenet_dropout", probability),
        ("model.guided_attention.heads", optional(positive_int)),
    ]),
    batch_loss=batch_loss,
    # 40 utterances: 32 train in 8 batches of 4 (one epoch holds a stop at step 5); a small decoder and postnet
    test_overrides=("data.num_utterances=40", "data.max_digits=2", "data.val_size=4", "data.test_size=4",
                    "data.batch_size=4", "model.net.postnet_channels=16", "model.net.dec_prenet_dim=32",
                    "model.griffin_lim_iters=4", "model.max_frames_per_char=3", "model.free_running_samples=1"),
    explorer_input="speech",
)
