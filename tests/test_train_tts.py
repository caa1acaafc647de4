"""train.py model=tts end to end on a tiny eSpeak corpus (real synthesis, real features, real training), then the
synthesize entry point on its checkpoint, as a user runs both; and the config choices around them."""

from __future__ import annotations

import base64
import csv
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from helpers import compose_train, explorer_data, wandb_html_keys

from attnlab.core.paths import ROOT
from attnlab.runs.build import build_model
from attnlab.cli.train import run
from attnlab.core.errors import ConfigError
from attnlab.runs.config_tree import check_block_groups
from preloaded_python import run as run_python

QUIET = ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]
# A tiny corpus and model: 24 utterances of 0..99, 4 training batches of 4, a few Griffin-Lim iterations.
TINY = ["model=tts", "debug=fast", "data.num_utterances=24", "data.max_digits=2", "data.val_size=4",
        "data.test_size=4", "data.batch_size=4", "trainer.limit_train_batches=4", "model.net.postnet_channels=16",
        "model.net.dec_prenet_dim=32", "model.griffin_lim_iters=4", "model.max_frames_per_char=3",
        "model.free_running_samples=2", *QUIET]


@pytest.fixture(scope="module")
def tts_run(one_thread, tmp_path_factory, cache_dir) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tts_run")
    cfg = compose_train([*TINY, "logger=[csv,wandb]"], out, cache_dir)
    return out, run(cfg)


def test_train_tts_logs_metrics_samples_and_attention_maps(tts_run):
    out, metrics = tts_run
    for stage in ("val", "test"):
        for key in ("loss", "mel_l1", "mel_l1_before", "stop_bce", "stop_acc", "focus_rate_tf", "diagonal_rate_tf",
                    "focus_rate_fr", "diagonal_rate_fr", "skipped_chars", "repeats", "stop_rate", "length_ratio"):
            assert f"{stage}/{key}" in metrics and torch.isfinite(torch.tensor(metrics[f"{stage}/{key}"])), key
        assert 0 <= metrics[f"{stage}/stop_acc"] <= 1 and 0 < metrics[f"{stage}/focus_rate_tf"] <= 1
    assert "train/guided" in metrics and metrics["train/guided"] > 0
    (metrics_csv,) = out.glob("csv/version_*/metrics.csv")
    rows = list(csv.DictReader(open(metrics_csv)))
    assert any(r.get("perf/tokens_per_sec") for r in rows)  # throughput counts mel frames

    samples = sorted(p.name for p in (out / "tts_samples").iterdir())
    assert samples == ["epoch000.wav", "epoch000_alignment.png", "epoch000_mel.png"]
    audio, rate = sf.read(str(out / "tts_samples" / "epoch000.wav"))
    assert rate == 22050 and audio.ndim == 1 and len(audio) > 0 and abs(audio).max() > 0.5  # peak-normalized
    (maps,) = (out / "attention_maps").glob("epoch*")
    assert sorted(p.name for p in maps.glob("*.png")) == ["net.decoder.layers.0.cross_attn.png",
                                                          "net.decoder.layers.1.cross_attn.png"]
    (wandb_run,) = (out / "wandb").glob("offline-run-*")
    media = {p.parent.name + "/" + p.name.rsplit("_", 2)[0] for p in wandb_run.glob("files/media/**/*.*")
             if p.suffix in (".png", ".wav")}
    assert {"tts/mel", "tts/alignment", "tts/audio", "attention/net.decoder.layers.1.cross_attn"} <= media, media
    page = explorer_data(out)  # the attention explorer: every frame of the cross-attention, the guide's width
    assert page["view"]["family"] == "speech" and page["view"]["guide_g"] > 0
    assert {"net.decoder.layers.0.cross_attn", "net.decoder.layers.1.cross_attn"} <= {m["name"] for m in page["modules"]}
    assert wandb_html_keys(out) == {"attention/explorer"}
    assert (out / "checkpoints" / "last.ckpt").is_file()


def test_the_explorer_page_holds_the_epochs_audio_and_plays_it(tts_run):
    """The training run's explorer page carries each logged epoch's synthesized audio, compact (8-bit mu-law at
    16 kHz): the same synthesis as tts_samples/ (shared, not synthesized twice: the prenet's inference dropout would
    make a second one differ), and headless Chromium decodes it."""
    from explorer.browser_page import audio_duration, chromium, open_page
    from scipy.signal import resample_poly

    out, _ = tts_run
    (epoch,) = explorer_data(out)["epochs"]
    raw = io.BytesIO(base64.b64decode(epoch["audio"].removeprefix("data:audio/wav;base64,")))
    assert sf.info(raw).subtype == "ULAW"
    raw.seek(0)
    page_audio, rate = sf.read(raw)
    full, full_rate = sf.read(str(out / "tts_samples" / "epoch000.wav"))
    want = resample_poly(full, 320, 441)  # 22,050 -> 16,000 Hz
    assert (rate, full_rate, len(page_audio)) == (16000, 22050, len(want))
    assert np.corrcoef(page_audio, want)[0, 1] > 0.99  # the same wave, through 8-bit mu-law
    assert "free-running" in epoch["audio_caption"]
    page_size, wav_size = (out / "attention" / "explorer.html").stat().st_size, len(epoch["audio"])
    assert wav_size < 0.4 * (out / "tts_samples" / "epoch000.wav").stat().st_size * 4 / 3 and page_size < 3e6
    with chromium() as browser:
        if browser is None:
            pytest.skip("no headless browser here (tests/explorer/browser_page.py says why)")
        with open_page(browser, out / "attention" / "explorer.html") as opened:
            assert audio_duration(opened.page) == pytest.approx(len(page_audio) / 16000, abs=0.01)
            assert "free-running" in opened.page.text_content("#audio-caption")
            # the training page's map is teacher-forced, its audio free-running: it says which is which
            assert "teacher-forced" in opened.page.text_content("#map-mode")
            assert "free-running" in opened.page.text_content("#audio-mode")
            assert opened.errors == []


def run_synthesize(*overrides: str, stdin: str | None = None, cache_dir: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return run_python([sys.executable, "synthesize.py", *overrides], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, input=stdin)


def test_synthesize_writes_playable_wavs(tts_run, tmp_path):
    """The entry point's work in-process (the CLI itself: the slow test below)."""
    from attnlab.cli.synthesize import load_tts, read_texts, synthesize
    from attnlab.tasks.tts import TTSTask

    task = load_tts(tts_run[0] / "checkpoints" / "last.ckpt")
    assert isinstance(task, TTSTask) and not task.training and task.mel_cfg.sample_rate == 22050
    results = synthesize(task, read_texts("Twenty  one"), tmp_path, max_frames_per_char=3, griffin_lim_iters=4)
    (r,) = results
    assert r["text"] == "twenty one" and 0 < r["frames"] <= 3 * 10 + 20
    audio, rate = sf.read(str(r["wav"]))
    assert rate == 22050 and len(audio) == (r["frames"] - 1) * 256 and abs(audio).max() > 0.5
    assert r["mel_png"].stat().st_size > 0 and r["alignment_png"].stat().st_size > 0


@pytest.mark.slow
def test_synthesize_cli_writes_playable_wavs(tts_run, cache_dir, tmp_path):
    ckpt = tts_run[0] / "checkpoints" / "last.ckpt"
    proc = run_synthesize(f"ckpt={ckpt}", "text=-", "griffin_lim_iters=4", "max_frames_per_char=3",
                          f"hydra.run.dir={tmp_path}", stdin="twenty one\n\nSeven\n", cache_dir=cache_dir)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "'twenty one' ->" in proc.stdout and "'seven' ->" in proc.stdout
    for i in (0, 1):
        audio, rate = sf.read(str(tmp_path / f"utt_{i:02d}.wav"))
        assert rate == 22050 and audio.ndim == 1 and len(audio) >= 256 and abs(audio).max() > 0.5
        assert (tmp_path / f"utt_{i:02d}_mel.png").stat().st_size > 0
        assert (tmp_path / f"utt_{i:02d}_alignment.png").stat().st_size > 0
    assert not (tmp_path / "utt_02.wav").exists()


def _one_line_error(proc: subprocess.CompletedProcess, message: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert len([line for line in out.splitlines() if message in line]) == 1, out[-3000:]
    return out


def test_synthesize_refuses_missing_and_other_family_checkpoints(cache_dir, tmp_path):
    """The shared loader (checkpoints.load_task, weights_only=True): one line naming the file and, for another
    model family, the entry point that serves it."""
    from attnlab.core.errors import CheckpointError
    from attnlab.cli.synthesize import load_tts

    missing = tmp_path / "nope.ckpt"
    # paths.log_dir rather than hydra.run.dir: the default run dir (outputs/synthesize/runs/<time>) must resolve too
    out = _one_line_error(run_synthesize(f"ckpt={missing}", "text=one", f"paths.log_dir={tmp_path / 'logs'}",
                                         cache_dir=cache_dir), "checkpoint not found")
    assert str(missing) in out
    assert not (tmp_path / "logs").exists()  # a refused command leaves no run folder (run_folder.RunFolderCheck)
    lm = ROOT / "tests" / "fixtures" / "legacy_causal_lm.ckpt"  # a language model: generate.py serves it
    _one_line_error(run_synthesize(f"ckpt={lm}", "text=one", f"hydra.run.dir={tmp_path / 'lm'}", cache_dir=cache_dir),
                    "is a language model checkpoint, not a text-to-speech checkpoint; use generate.py")
    vit = tmp_path / "vit.ckpt"  # what train.py model=vit writes: a task_class naming the ViT task
    torch.save({"task_class": "attnlab.tasks.vit.ImageClassificationTask", "state_dict": {}}, vit)
    with pytest.raises(CheckpointError, match=r"is an image classifier checkpoint, not a text-to-speech checkpoint"):
        load_tts(vit)
    bare = tmp_path / "bare.ckpt"
    torch.save({"a": 1}, bare)
    with pytest.raises(CheckpointError, match=r"not a text-to-speech checkpoint written by attnlab's train.py"):
        load_tts(bare)
    (tmp_path / "text.ckpt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match=r"not a PyTorch checkpoint file"):
        load_tts(tmp_path / "text.ckpt")


def test_trained_checkpoint_holds_plain_types_only(tts_run):
    from attnlab.checkpoints.read import read_checkpoint

    assert read_checkpoint(tts_run[0] / "checkpoints" / "last.ckpt")["task_class"] == "attnlab.tasks.tts.TTSTask"


def test_split_text_keeps_pieces_within_the_model_and_cuts_at_sentences_first():
    from attnlab.cli.synthesize import split_text

    text = "one two three, four five six seven; eight nine. ten eleven twelve thirteen! " + "x" * 30
    assert split_text(text, 200) == [text]  # short enough: unchanged
    assert split_text(text, 50) == ["one two three, four five six seven; eight nine.", "ten eleven twelve thirteen!",
                                    "x" * 30]
    for limit in (20, 12, 8):
        pieces = split_text(text, limit)
        assert all(0 < len(p) <= limit for p in pieces), pieces
        assert "".join(pieces).replace(" ", "") == text.replace(" ", "")  # nothing lost, nothing added


def test_synthesize_cli_speaks_a_text_longer_than_the_model_reads_in_pieces(tts_run, cache_dir, tmp_path):
    """Longer than the 256 character positions (a traceback before): two sentences, one WAV of both pieces with
    piece_silence between them."""
    sentence = ("one hundred and twenty three thousand four hundred and fifty six, seven hundred and eighty nine "
                "thousand and twelve, three hundred and forty five")
    text = f"{sentence}. {sentence}."
    assert len(text) > 256
    proc = run_synthesize(f"ckpt={tts_run[0] / 'checkpoints' / 'last.ckpt'}", f"text='{text}'", "griffin_lim_iters=2",
                          "max_frames_per_char=1", "piece_silence=0.5", f"hydra.run.dir={tmp_path}",
                          cache_dir=cache_dir)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if "->" in x]
    frames = int(re.search(r"\((\d+) frames, 2 pieces\)", line).group(1))
    audio, rate = sf.read(str(tmp_path / "utt_00.wav"))
    # each piece's Griffin-Lim gives (frames - 1) hops of samples; the silence sits between the two
    assert len(audio) == (frames - 2) * 256 + round(0.5 * rate)
    assert (tmp_path / "utt_00_mel.png").stat().st_size > 0 and (tmp_path / "utt_00_alignment.png").stat().st_size > 0
    assert not (tmp_path / "utt_01.wav").exists()


def test_synthesize_cli_refuses_bad_options_in_one_line(cache_dir, tmp_path):
    from attnlab.core.errors import OptionError
    from attnlab.cli.synthesize import check_options
    from test_safe_checkpoints import compose_cli

    _one_line_error(run_synthesize("ckpt=x.ckpt", "text=one", "griffin_lim_iters=0", f"hydra.run.dir={tmp_path}",
                                   cache_dir=cache_dir), "griffin_lim_iters=0 is not allowed: an integer >= 1")
    for bad, words in [("max_frames_per_char=0", "max_frames_per_char=0"), ("piece_silence=-1", "piece_silence=-1"),
                       ("text=' '", "text=' ' is not allowed"), ("input_errors=x", "input_errors='x'"),
                       # inf reached a tensor size (a traceback), a 20-digit seed the generator (an overflow)
                       ("max_frames_per_char=inf", "max_frames_per_char=inf"), ("seed=100000000000000000000", "seed="),
                       # a file where the folder goes: refused before the model is loaded, the file kept
                       (f"out_dir={Path(__file__)}", "is a file; give the path of a folder"),
                       (f"out_dir={Path(__file__)}/x", f"cannot be created: {Path(__file__)} is a file")]:
        with pytest.raises(OptionError, match=re.escape(words)):
            check_options(compose_cli("synthesize", ["ckpt=x.ckpt", "text=one", bad]))
    with pytest.raises(OptionError, match=re.escape("text= is required")):
        check_options(compose_cli("synthesize", ["ckpt=x.ckpt"]))


def test_guided_attention_off_trains_without_the_term(tmp_path, one_thread):
    """model.guided_attention.enabled=false: no guided term and no explicit attention path in training steps."""
    cfg = compose_train([*TINY, "model.guided_attention.enabled=false"], tmp_path)
    task = build_model(cfg.model)
    assert task.guided["enabled"] is False and task.guided["layers"] == [0, 1]
    logged = {}
    task.log = lambda name, value, **kw: logged.__setitem__(name, value)  # no trainer attached
    text, mel = torch.randint(2, 50, (2, 7)), torch.randn(2, 12, 80)
    batch = {"text": text, "text_lengths": torch.tensor([7, 5]), "mel": mel, "mel_lengths": torch.tensor([12, 9])}
    loss = task.training_step(batch, 0)
    assert "train/guided" not in logged and torch.isfinite(loss)
    assert all(layer.cross_attn.weights is None for layer in task.net.decoder.layers)
    on = build_model(compose_train(TINY, tmp_path).model)
    on.log = lambda name, value, **kw: logged.__setitem__(name, value)
    on.training_step(batch, 0)
    assert logged["train/guided"] > 0


def test_tts_block_groups_apply_and_pos_is_refused(tmp_path):
    from attnlab.modules.moe import MixtureOfExperts

    cfg = compose_train(["model=tts", "norm=rms", "ffn=swiglu", "moe=on", "moe.num_experts=2"], tmp_path)
    assert cfg.data._target_.endswith("EspeakDataModule")  # model=tts brings its data set
    net = build_model(cfg.model).net
    blocks = [*net.encoder.layers, *net.decoder.layers]
    assert all(isinstance(b.sa_norm, torch.nn.RMSNorm) and isinstance(b.ffn, MixtureOfExperts) for b in blocks)
    with pytest.raises(ConfigError, match=r"pos= does not apply to model=tts"):
        check_block_groups(compose_train(["model=tts", "pos=rotary"], tmp_path), ["model=tts", "pos=rotary"])
    lj = compose_train(["model=tts", "data=ljspeech", "data.path=/some/where"], tmp_path)
    assert lj.data._target_.endswith(".SpeechDataModule") and lj.model.mel.n_mels == 80
