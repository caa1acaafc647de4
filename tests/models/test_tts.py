"""Transformer-TTS as a module: shapes and reduction factor, the stepper's incremental decoding equals the
teacher-forced pass, the prenet's dropout stays on at inference, and the model overfits a few real utterances."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.audio.espeak import ESpeak
from attnlab.audio.features import MelExtractor
from attnlab.data.characters import CharVocab
from attnlab.core.special_tokens import CHAR_EOS_ID as EOS_ID
from attnlab.data.speech_datamodule import collate_speech
from attnlab.decoding.tts import TTSStepper, generate_mel
from attnlab.models.tts import TransformerTTS
from attnlab.modules.guided_attention import guided_attention_loss

TINY = dict(vocab_size=51, d_model=32, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, dec_prenet_dim=32,
            postnet_channels=16, dropout=0.0)


pytestmark = pytest.mark.usefixtures("one_thread")


def batch_of(texts: list[str]) -> dict:
    vocab, extract, engine = CharVocab(), MelExtractor(), ESpeak.get()
    items = [{"text": torch.tensor(vocab.encode(t)), "index": i,
              "mel": extract(torch.from_numpy(engine.synthesize(t).astype(np.float32) / 32768))}
             for i, t in enumerate(texts)]
    return collate_speech(items)


def test_shapes_reduction_and_decoder_inputs():
    torch.manual_seed(0)
    model = TransformerTTS(**TINY, reduction=3).eval()
    text = torch.randint(2, 50, (2, 9))
    mel = torch.randn(2, 13, 80)  # 13 frames -> 5 steps of 3 (the last group padded)
    out = model(text, torch.tensor([9, 6]), mel, torch.tensor([13, 7]), attention_layers=[-1])
    assert out["mel_before"].shape == out["mel_after"].shape == (2, 15, 80)
    assert out["stop_logits"].shape == (2, 15)
    assert out["dec_lengths"].tolist() == [5, 3]
    (att,) = out["attention"]
    assert att.shape == (2, 2, 5, 10)  # 9 characters + <eos>
    assert out["text_lengths"].tolist() == [10, 7]
    assert torch.allclose(att.sum(-1), torch.ones(2, 2, 5), atol=1e-5)
    assert (att[1, :, :, 7:] == 0).all()  # padding gets no attention
    assert (att[0, :, :, 9] > 0).all() and (att[1, :, :, 6] > 0).all()  # <eos> (after the last character) some
    inputs = model.decoder_inputs(mel)  # step g reads the last frame of group g-1
    assert inputs.shape == (2, 5, 80) and (inputs[:, 0] == 0).all()
    assert torch.equal(inputs[:, 1], mel[:, 2]) and torch.equal(inputs[:, 4], mel[:, 11])
    # only the asked-for layers took the explicit path; the others kept SDPA
    assert model.decoder.layers[0].cross_attn.weights is None and not model.decoder.layers[1].cross_attn.return_weights


def test_text_eos_is_appended_after_each_text_and_optional():
    """ESPnet's convention: <eos> right after the last character (before the padding); off, the text alone."""
    model = TransformerTTS(**TINY)
    text, tl = torch.tensor([[5, 6, 7], [8, 9, 0]]), torch.tensor([3, 2])
    ids, lengths = model.append_eos(text, tl)
    assert ids.tolist() == [[5, 6, 7, EOS_ID], [8, 9, EOS_ID, 0]] and lengths.tolist() == [4, 3]
    assert model.max_chars == model.max_text_len - 1 and model.char_labels(text[1], 2)[-1] == "<eos>"
    plain = TransformerTTS(**TINY, text_eos=False).eval()
    assert plain.append_eos(text, tl)[0] is text and plain.max_chars == plain.max_text_len
    out = plain(text, tl, torch.randn(2, 6, 80), attention_layers=[-1])
    assert out["attention"][0].shape[-1] == 3 and out["text_lengths"].tolist() == [3, 2]
    with pytest.raises(ValueError, match="vocab_size >= 51"):
        TransformerTTS(**{**TINY, "vocab_size": 50})


def test_incremental_decoding_equals_teacher_forcing():
    torch.manual_seed(1)
    model = TransformerTTS(**TINY, reduction=2, prenet_always_dropout=False).eval()
    text, tl = torch.randint(2, 50, (3, 11)), torch.tensor([11, 8, 5])
    mel = torch.randn(3, 16, 80)
    ref = model(text, tl, mel, attention_layers=[0, 1])
    stepper = TTSStepper(model, text, tl, max_steps=8)
    inputs = model.decoder_inputs(mel)
    outs, stops = [], []
    frames, stop = stepper.prefill(inputs[:, :3])  # a 3-step prefix in one call, then one step at a time
    first, _ = model.project(model.decode(inputs[:, :3], *model.encode(text, tl)))
    assert torch.allclose(first, ref["mel_before"][:, :6], atol=1e-5)
    outs.append(frames), stops.append(stop)
    for g in range(3, 8):
        frames, stop = stepper.step(inputs[:, g])
        outs.append(frames), stops.append(stop)
    assert torch.allclose(torch.cat(outs, 1), ref["mel_before"][:, 4:], atol=1e-5)
    assert torch.allclose(torch.cat(stops, 1), ref["stop_logits"][:, 4:], atol=1e-5)
    for layer, (rec, full) in enumerate(zip(stepper.alignments(), ref["attention"])):
        assert rec.shape == (3, 2, 8, 12)  # the prefill's 3 steps, then one per step; 11 characters + <eos>
        assert torch.allclose(rec, full, atol=1e-5), layer
    # reorder keeps rows and their caches together
    stepper.reorder(torch.tensor([2, 0]))
    assert stepper.memory.shape[0] == 2 and stepper.caches[0].self_attn.k.shape[0] == 2


def test_prenet_dropout_stays_on_at_inference():
    torch.manual_seed(2)
    model = TransformerTTS(**TINY).eval()
    text, tl, mel = torch.randint(2, 50, (1, 6)), torch.tensor([6]), torch.randn(1, 9, 80)
    a, b = model(text, tl, mel)["mel_before"], model(text, tl, mel)["mel_before"]
    assert not torch.allclose(a, b)
    model.dec_prenet.always_dropout = False
    assert torch.equal(model(text, tl, mel)["mel_before"], model(text, tl, mel)["mel_before"])


def test_generate_stops_and_bounds_length():
    torch.manual_seed(3)
    model = TransformerTTS(**TINY, reduction=2).eval()
    text, tl = torch.randint(2, 50, (2, 5)), torch.tensor([5, 3])
    with torch.no_grad():
        model.stop_head.bias.fill_(-20.0)  # never stops: cut at 4 frames per char + 20
    gen = generate_mel(model, text, tl, max_frames_per_char=4.0)
    assert gen.lengths.tolist() == [40, 32] and not gen.stopped.any()
    assert (gen.mel[1, 32:] == 0).all() and gen.attention[0].shape[2] == 20
    with torch.no_grad():
        model.stop_head.bias.copy_(torch.tensor([-20.0, 20.0]))  # the second frame of the first step fires
    gen = generate_mel(model, text, tl)
    assert gen.lengths.tolist() == [2, 2] and gen.stopped.all() and gen.steps.tolist() == [1, 1]


def test_overfits_a_few_real_utterances():
    """Eight eSpeak utterances, 120 Adam steps: the mel loss falls to well under half and attention aligns."""
    torch.manual_seed(0)
    batch = batch_of(["one", "twenty one", "three hundred", "forty-two", "seven", "five thousand", "ninety",
                      "one hundred and six"])
    model = TransformerTTS(**{**TINY, "dec_prenet_dropout": 0.1}, reduction=3)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    mask = (torch.arange(batch["mel"].shape[1])[None] < batch["mel_lengths"][:, None])[..., None]

    def step() -> tuple[float, float]:
        out = model(batch["text"], batch["text_lengths"], batch["mel"], batch["mel_lengths"], attention_layers=[-1])
        t = batch["mel"].shape[1]
        l1 = ((out["mel_after"][:, :t] - batch["mel"]).abs() * mask).sum() / (mask.sum() * 80)
        l1b = ((out["mel_before"][:, :t] - batch["mel"]).abs() * mask).sum() / (mask.sum() * 80)
        ga = guided_attention_loss(out["attention"], batch["text_lengths"], out["dec_lengths"])
        opt.zero_grad()
        (l1 + l1b + ga).backward()
        l1, ga = l1.detach(), ga.detach()
        opt.step()
        return l1.item(), ga.item()

    first, ga_first = step()
    for _ in range(120):
        last, ga_last = step()
    assert last < 0.5 * first, (first, last)
    assert ga_last < 0.5 * ga_first, (ga_first, ga_last)


@pytest.mark.parametrize("text_eos", [True, False])
def test_task_guided_loss_is_espnets_formula_on_the_text_and_eos(text_eos):
    """The TTS task's train/guided: ESPnet's GuidedAttentionLoss, W[t, n] = 1 − exp(−(n/N − t/T)² / (2σ²)) built per
    utterance with N the positions the attention reads (characters + <eos>: ESPnet's ilens count the eos it adds),
    averaged over the valid cells of every guided head."""
    from attnlab.tasks.tts import TTSTask

    torch.manual_seed(4)
    model = TransformerTTS(**{**TINY, "dec_prenet_dropout": 0.0}, text_eos=text_eos)
    task = TTSTask(net=model, guided_attention={"sigma": 0.3, "weight": 1.0})
    logged = {}
    task.log = lambda name, value, **kw: logged.__setitem__(name, value)  # no trainer attached
    text, tl = torch.randint(2, 50, (2, 7)), torch.tensor([7, 4])
    mel, ml = torch.randn(2, 14, 80), torch.tensor([14, 8])
    task.training_step({"text": text, "text_lengths": tl, "mel": mel, "mel_lengths": ml}, 0)
    with torch.no_grad():
        out = model(text, tl, mel, ml, attention_layers=task.guided["layers"])  # the same maps (no dropout)
    heads = torch.cat([a[:, : task.guided["heads"]] for a in out["attention"]], dim=1)  # (B, H', G, N')
    assert heads.shape[-1] == 7 + text_eos
    total, cells = 0.0, 0
    for b in range(2):
        ilen, olen = int(tl[b]) + int(text_eos), int(-(-ml[b] // model.reduction))
        t, n = torch.meshgrid(torch.arange(olen).float(), torch.arange(ilen).float(), indexing="ij")
        w = 1.0 - torch.exp(-((n / ilen - t / olen) ** 2) / (2 * 0.3**2))
        total += float((heads[b, :, :olen, :ilen] * w).sum())
        cells += heads.shape[1] * olen * ilen
    assert float(logged["train/guided"].detach()) == pytest.approx(total / cells, rel=1e-5)
