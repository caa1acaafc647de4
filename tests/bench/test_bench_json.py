"""``python -m bench --json FILE``: the machine facts and every table's raw numbers, readable by scripts (claim E6)."""

import json
import sys
import types

import pytest

from attnlab.core.paths import ROOT


@pytest.fixture
def bench_main(monkeypatch):
    """bench's main() with a fake comparison P0 (instant) registered beside the real ones."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench import __main__ as cli
    from bench.common import Table

    def run(quick=False, repeats=None):
        table = Table("P0 fake", ["T", "ms", "ratio"], meta={"quick": quick, "repeats": repeats})
        table.add(256, 1.2345678, "2.00×")
        table.add(512, 4.5, "3.00×")
        return [table]

    monkeypatch.setitem(sys.modules, "bench.p0_fake", types.SimpleNamespace(run=run))
    monkeypatch.setitem(cli.COMPARISONS, "P0", "p0_fake")
    return cli.main


def test_json_has_machine_and_raw_rows(bench_main, tmp_path, capsys):
    path = tmp_path / "sub" / "bench.json"
    assert bench_main(["--only", "P0", "--quick", "--threads", "1", "--repeats", "2", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["threads"] == 1 and record["quick"] is True and "--json" in record["command"]
    assert "cpu" in record["machine"] and "torch" in record["machine"]
    (table,) = record["comparisons"]["P0"]["tables"]
    # unrounded numbers (the markdown shows 1.23), each row also keyed by column
    assert table["records"][0] == {"T": 256, "ms": 1.2345678, "ratio": "2.00×"}
    assert table["rows"][1] == [512, 4.5, "3.00×"]
    assert table["meta"] == {"quick": True, "repeats": 2}
    assert "| 256 | 1.23 | 2.00× |" in capsys.readouterr().out  # the printed table is unchanged
    assert not list(path.parent.glob("*.tmp"))


def test_no_json_without_flag(bench_main, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bench_main(["--only", "P0", "--threads", "1"]) == 0
    assert list(tmp_path.iterdir()) == []
