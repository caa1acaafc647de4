"""attnlab's Hydra plugins. Hydra instantiates a sweeper only from a class defined under the ``hydra_plugins``
namespace package, so the classes are declared here (what they do is in :mod:`attnlab.runs.sweeper` and
:mod:`attnlab.runs.optuna_sweeper`). Hydra finds this module by scanning ``hydra_plugins``, which an editable
install's import hook hides from it: train.py registers the classes itself as well
(:func:`attnlab.runs.sweeper_plugins.register`)."""

from hydra.plugins.sweeper import Sweeper

from attnlab.runs.optuna_sweeper import OptunaSweeper as _OptunaSweeper
from attnlab.runs.sweeper import ContinuableSweeper as _ContinuableSweeper


class ContinuableSweeper(_ContinuableSweeper):
    """``train.py -m``'s sweeper (conf/hydra/sweeper/continuable.yaml): attnlab.runs.sweeper.ContinuableSweeper."""


class OptunaSweeper(_OptunaSweeper, Sweeper):
    """``hparams_search=...`` (conf/hydra/sweeper/optuna_study.yaml): attnlab.runs.optuna_sweeper.OptunaSweeper."""
