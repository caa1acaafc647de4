"""attnlab's Hydra plugins. Hydra instantiates a sweeper or a launcher only from a class defined under the
``hydra_plugins`` namespace package, so the classes are declared here (what they do is in :mod:`attnlab.runs.sweeper`,
:mod:`attnlab.runs.optuna_sweeper` and :mod:`attnlab.runs.submitit_launcher`). Hydra finds this module by scanning ``hydra_plugins``, which an editable
install's import hook hides from it: train.py registers the classes itself as well
(:func:`attnlab.runs.sweeper_plugins.register`)."""

from hydra.plugins.sweeper import Sweeper

from attnlab.runs.optuna_sweeper import OptunaSweeper as _OptunaSweeper
from attnlab.runs.sweeper import ContinuableSweeper as _ContinuableSweeper


class ContinuableSweeper(_ContinuableSweeper):
    """``train.py -m``'s sweeper (conf/hydra/sweeper/continuable.yaml): attnlab.runs.sweeper.ContinuableSweeper."""


class OptunaSweeper(_OptunaSweeper, Sweeper):
    """``hparams_search=...`` (conf/hydra/sweeper/optuna_study.yaml): attnlab.runs.optuna_sweeper.OptunaSweeper."""


try:  # the `sweep` extra (hydra-submitit-launcher); without it, launcher= says what to install
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher
except ImportError:  # pragma: no cover
    LAUNCHERS: tuple = ()
else:
    from attnlab.runs.submitit_launcher import RequeueingLauncher

    class SubmititLocalLauncher(RequeueingLauncher, LocalLauncher):
        """``launcher=local`` (conf/hydra/launcher/requeueing_local.yaml): each job its own process."""

    class SubmititSlurmLauncher(RequeueingLauncher, SlurmLauncher):
        """``launcher=slurm`` (conf/hydra/launcher/requeueing_slurm.yaml): each job a SLURM job."""

    LAUNCHERS = (SubmititLocalLauncher, SubmititSlurmLauncher)
