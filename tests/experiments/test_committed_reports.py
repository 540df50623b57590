"""Every table report committed under results/ is what its record renders: the tables, seeds, record and
curves written by ``--report-only`` from a copy of the record equal the committed files byte for byte."""

import re
import shutil
from pathlib import Path

import pytest

from fairseq_sparse import tables

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "results" / "study"
RECORDED = sorted(path.name[: -len(".seeds.csv")] for path in RECORD.glob("*.seeds.csv"))
# not a function of the record: commands.sh is copied from the last sitting's run folder, and matplotlib
# writes PNG bytes of its own
RENDERED = (".md", ".csv", ".seeds.csv", ".curves.csv")


@pytest.mark.parametrize("name", RECORDED)
def test_a_committed_report_re_renders_identically_from_its_record(name, tmp_path, monkeypatch):
    record = tmp_path / "record"
    shutil.copytree(RECORD, record)
    monkeypatch.chdir(ROOT)  # the report names its configuration relative to the checkout
    # models and data of this machine's own runs stay out: the report is the record's alone
    assert tables.main([name, "--profile", "paper", "--record", str(record), "--report-only", "--out", str(tmp_path / "out"),
                        "--models-root", str(tmp_path / "models"), "--data-root", str(tmp_path / "data")]) == 0
    compared = 0
    for suffix in RENDERED:
        committed = RECORD / f"{name}{suffix}"
        if not committed.is_file():
            continue
        rendered = (record / f"{name}{suffix}").read_text(encoding="utf-8")
        if suffix == ".md":  # where this sitting wrote its commands, not part of the record
            rendered = re.sub(r"commands: `[^`]*`", f"commands: `runs/tables/{name}/paper/commands.sh`", rendered, count=1)
        assert rendered == committed.read_text(encoding="utf-8"), f"{committed} differs from its re-rendering"
        compared += 1
    assert compared >= 2
