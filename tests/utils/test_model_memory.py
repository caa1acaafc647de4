"""A net's parameters are counted without allocating them: built on the meta device, or, past
BUILT_UP_TO_LAYERS layers, extrapolated from nets of two and three layers; the extrapolation is exact."""

from __future__ import annotations

import pytest
from helpers import compose_train
from omegaconf import OmegaConf

from attnlab.families import model_names
from attnlab.runs.model_memory import BUILT_UP_TO_LAYERS, _count_built, count_parameters


@pytest.mark.parametrize("model", model_names())
def test_a_deep_net_is_counted_exactly_without_being_built(model, tmp_path):
    cfg = compose_train([f"model={model}", "debug=fast"], tmp_path)
    net = OmegaConf.to_container(cfg.model.net, resolve=True)
    layers = [k for k, v in net.items() if k.endswith("layers") and isinstance(v, int) and not isinstance(v, bool)]
    assert layers, net  # every family has a layer count
    deep = {**net, **{k: BUILT_UP_TO_LAYERS + 1 + i for i, k in enumerate(layers)}}
    assert count_parameters(deep) == _count_built(deep) > count_parameters(net)
