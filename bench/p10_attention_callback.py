"""P10: what the attention-map callback costs at its interval, on the default job (translation, ``python train.py``),
and what a TTS page's audio adds (``model=tts``).

The callback runs once per validation epoch (``every_n_epochs: 1``): one batch-1 forward with weights on the fixed
sample, then, as configured, the PNGs (matplotlib), the explorer page (8-bit maps of every logged epoch, one HTML
file rewritten) and the attention-health scalars. Each configuration's cost is timed on the same captured sample
(the callback's ``render``, after a short fit so the trainer and datamodule are real; the explorer record holds
the epochs of a full default run, 4, while it is timed), beside the training time of one default epoch: the
steps per epoch of the default data times a measured training step, with no callback. ``--quick``: ``debug=fast``
shapes.

The TTS table: the explorer's audio of one logged epoch, the listening sample's free-running audio encoded for the
page (16 kHz, 8-bit mu-law). The task computes that sample once per step, so with the tts_samples callback on (the
default) the explorer only encodes it; with it off, the callback synthesizes it (free-running decoding and
Griffin-Lim). Beside one default TTS epoch of training, measured the same way.
"""

from __future__ import annotations

import time

from .common import Table, median


def _time(fn, repeats: int) -> float:
    fn()  # warm-up: first matplotlib figure, first page template read
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return median(ts)


def _compose(overrides: list[str], tmp: str):
    from attnlab.core.paths import CONF_DIR
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides + ["logger=none"])
    with open_dict(cfg):
        cfg.paths.output_dir = tmp
    return cfg


def _fit_and_time_steps(cfg, steps: int, tmp: str):
    """A short fit (real trainer and datamodule) timing its training steps: (trainer, model, dm, median step s)."""
    import hydra
    import lightning as L

    from attnlab.runs.build import build_model

    dm = hydra.utils.instantiate(cfg.data)
    model = build_model(cfg.model)

    class StepTimes(L.Callback):
        def __init__(self):
            self.t, self.times = 0.0, []

        def on_train_batch_start(self, *a):
            self.t = time.perf_counter()

        def on_train_batch_end(self, *a):
            self.times.append(time.perf_counter() - self.t)

    timer = StepTimes()
    trainer = L.Trainer(max_epochs=1, limit_train_batches=steps, limit_val_batches=1, num_sanity_val_steps=0,
                        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp,
                        callbacks=[timer])
    trainer.fit(model, datamodule=dm)
    return trainer, model, dm, median(timer.times[1:])  # the first step warms up


def _tts_table(quick: bool, repeats: int, tmp: str) -> Table:
    from attnlab.plots.views import audio_note

    cfg = _compose(["model=tts"] + (["debug=fast"] if quick else []), tmp)
    trainer, model, dm, step = _fit_and_time_steps(cfg, 4 if quick else 8, tmp)
    per_epoch = len(dm.train_dataloader())
    epoch_s = step * per_epoch

    def synthesize():
        model._listening = None  # what the explorer pays with the tts_samples callback off
        return model.listening_sample()

    ls = synthesize()
    seconds = len(ls.wave) / ls.sample_rate
    table = Table(f"P10 TTS: the explorer's audio at its interval vs one epoch of {'debug=fast' if quick else 'model=tts'}"
                  f" ({per_epoch} steps/epoch; the sample speaks {seconds:.1f} s)",
                  ["at the interval", "ms per interval", "epoch training s (no callback)", "% of the epoch"])
    rows = {"encode the shared sample (tts_samples on, the default)": lambda: audio_note(ls.wave, ls.sample_rate, ""),
            "synthesize and encode (tts_samples off)": lambda: audio_note(synthesize().wave, ls.sample_rate, "")}
    for name, fn in rows.items():
        t = _time(fn, repeats)
        table.add(name, 1000 * t, epoch_s, f"{100 * t / epoch_s:.2f}%")
    table.meta.update({"step_s": step, "steps_per_epoch": per_epoch, "audio_s": seconds,
                       "audio_bytes_in_page": len(audio_note(ls.wave, ls.sample_rate, "").get("audio", ""))})
    table.notes.append(f"The page holds {table.meta['audio_bytes_in_page'] / 1000:.0f} kB of audio per logged epoch "
                       "for this sample (the last `explorer_audio_epochs` epochs keep theirs).")
    return table


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    import tempfile

    repeats = repeats or (2 if quick else 5)
    # the fits' and the callback's files (maps, explorer pages) only serve the timing: removed when it is done
    with (tempfile.TemporaryDirectory(prefix="bench_p10_") as tmp,
          tempfile.TemporaryDirectory(prefix="bench_p10_tts_") as tts_tmp):
        return [_callback_table(quick, repeats, tmp), _tts_table(quick, repeats, tts_tmp)]


def _callback_table(quick: bool, repeats: int, tmp: str) -> Table:
    from attnlab.callbacks.attention_maps import AttentionMapCallback

    cfg = _compose(["debug=fast"] if quick else [], tmp)
    default_epochs = int(cfg.trainer.max_epochs)
    cb_cfg = cfg.callbacks.attention_maps
    trainer, model, dm, step = _fit_and_time_steps(cfg, 4 if quick else 12, tmp)
    per_epoch = len(dm.train_dataloader())
    epoch_s = step * per_epoch

    def callback(png: bool, explorer: bool, health: bool) -> AttentionMapCallback:
        cb = AttentionMapCallback(max_tokens=cb_cfg.max_tokens, max_heads=cb_cfg.max_heads,
                                  max_layers=None if png else 0, explorer=explorer, health=health,
                                  dirpath=f"{tmp}/maps")
        if explorer:  # the page holds a whole run's epochs while it is rewritten
            for _ in range(default_epochs - 1):
                cb.render(trainer, model)
        return cb

    configs = {"PNG only (before the explorer)": (True, False, False),
               "explorer page + health, no PNG": (False, True, True),
               "health only": (False, False, True),
               "default: PNG + explorer + health": (True, True, True)}
    table = Table(f"P10 attention-map callback at its interval vs one epoch of the default job "
                  f"({'debug=fast' if quick else 'translation'}, {per_epoch} steps/epoch)",
                  ["callback", "ms per interval", "epoch training s (no callback)", "% of the epoch"])
    table.add("no callback", 0.0, epoch_s, "0.00%")
    for name, flags in configs.items():
        cb = callback(*flags)
        t = _time(lambda: cb.render(trainer, model), repeats)
        table.add(name, 1000 * t, epoch_s, f"{100 * t / epoch_s:.2f}%")
    table.meta.update({"step_s": step, "steps_per_epoch": per_epoch})
    table.notes.append("The explorer is also logged to W&B once at the end of fit (one file); the PNG rows are what "
                       "the callback cost before the explorer and the health metrics were added.")
    return table
