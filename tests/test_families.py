"""The family registry (attnlab.families) agrees with conf/: every conf/model option belongs to exactly one family,
whose task and net are the ones the option builds; the docs name no family the registry lacks."""

from __future__ import annotations

import re
import sys

import pytest
from helpers import compose_train

from attnlab.families import DATA_KINDS, families, for_config, for_task, get, model_names
from attnlab.core.paths import CONF_DIR, ROOT
from preloaded_python import run as run_python


def test_every_model_option_belongs_to_one_family():
    options = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
    assert sorted(model_names()) == options  # no option without a family, no family without its YAML


@pytest.mark.parametrize("model", model_names())
def test_a_family_builds_its_declared_task_and_net(model, tmp_path):
    family = get(model)
    cfg = compose_train([f"model={model}"], tmp_path)
    assert cfg.model._target_ == family.task and cfg.model.net._target_ == family.net
    assert for_config(cfg) is family and for_task(family.task).what == family.what
    assert family.data in DATA_KINDS and family.batch_loss is not None and family.description


def test_the_model_table_lists_every_family():
    out = run_python([sys.executable, "-m", "attnlab.families"], capture_output=True, text=True, check=True)
    rows = [line for line in out.stdout.splitlines() if line.startswith("| `") and "model=" not in line]
    assert len(rows) == len(families())
    for family in families():
        assert any(f"`{family.name}`" in row and family.serves in row for row in rows)


@pytest.mark.parametrize("doc", ["README.md", "docs/config_groups.md"])
def test_the_docs_name_only_registered_models(doc):
    """The docs' model rows may name a subset (python -m attnlab.families prints all), never a stale name."""
    row = next(line for line in (ROOT / doc).read_text().splitlines() if line.startswith("| `model` |"))
    named = re.findall(r"`(\w+)`", row.split("|")[2])
    assert named and set(named) <= set(model_names()), named
