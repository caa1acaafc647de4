"""Report a trial's validation metric to its Optuna study after each validation, and stop the trial when the
study's pruner says so (the job then ends "pruned": :func:`attnlab.runs.outcome.job_failed`).

Added by train.py to the jobs of an Optuna search (``trial.id`` set by :mod:`attnlab.runs.optuna_sweeper`). The
study is opened from its storage in the job's own process, so the same works whatever the launcher (in this
process, joblib, submitit).
"""

from __future__ import annotations

import logging

import lightning as L

log = logging.getLogger(__name__)


class OptunaPruning(L.Callback):
    def __init__(self, study: str, storage: str, trial_id: int, monitor: str, pruner: dict | None = None) -> None:
        """``pruner``: the search's pruner config (``_target_`` and arguments; None: never prune)."""
        super().__init__()
        self.study_name, self.storage, self.trial_id, self.monitor = study, storage, int(trial_id), monitor
        self.pruner_cfg = pruner
        self._trial = None

    def _get_trial(self):
        if self._trial is None:
            import optuna

            from hydra.utils import instantiate

            # the study keeps no pruner of its own: this job's is the search's (Optuna's default would be a median)
            pruner = instantiate(self.pruner_cfg) if self.pruner_cfg else optuna.pruners.NopPruner()
            study = optuna.load_study(study_name=self.study_name, storage=self.storage, pruner=pruner)
            self._trial = optuna.trial.Trial(study, self.trial_id)
        return self._trial

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        epoch = trainer.current_epoch
        value = float(trainer.callback_metrics[self.monitor])
        if not trainer.is_global_zero:
            return
        trial = self._get_trial()
        if epoch not in trial.storage.get_trial(self.trial_id).intermediate_values:  # (a resumed part: once)
            trial.report(value, step=epoch)
        if trial.should_prune():
            import optuna

            stop = optuna.TrialPruned(f"pruned by {type(trial.study.pruner).__name__} after epoch {epoch} "
                                      f"({self.monitor} = {value:.4f})")
            stop.epochs, stop.max_epochs = epoch + 1, trainer.max_epochs  # what the summary counts as saved
            raise stop
