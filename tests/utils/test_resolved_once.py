"""train.py resolves the config once (in validate_config) and builds, prints and logs from that: the resolved
config is the config's, and the tree printed from it is the one printed from the config itself."""

from __future__ import annotations

import pytest
from helpers import compose_train
from omegaconf import OmegaConf

from attnlab.families import families
from attnlab.runs.config_tree import print_config_tree
from attnlab.runs.validate import validate_config


@pytest.mark.parametrize("family", families(), ids=lambda f: f.name)
def test_the_tree_printed_from_the_resolved_config_is_the_configs(family, tmp_path):
    cfg = compose_train([f"model={family.name}"], tmp_path)
    print_config_tree(cfg, save_to=tmp_path / "from_config.log")
    print_config_tree(OmegaConf.to_container(cfg, resolve=True), save_to=tmp_path / "from_resolved.log")
    assert (tmp_path / "from_resolved.log").read_text() == (tmp_path / "from_config.log").read_text()


def test_validate_config_returns_the_config_resolved(tmp_path):
    cfg = compose_train(["debug=fast"], tmp_path)
    assert validate_config(cfg) == OmegaConf.to_container(cfg, resolve=True)
