"""The study's pages quote their records: every number tagged with a record (``<!-- TABLE/ROW/COLUMN/SEED -->``,
fairseq_sparse.experiments.study_numbers) equals it at the decimals quoted, the verdict table's measured
numbers are all tagged, the noise floors are the t-lines of the committed records, and no paragraph of the
study README runs past 200 words."""

import math
import re
import statistics
from pathlib import Path

import pytest

from fairseq_sparse.experiments import study_numbers

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "results" / "study"
PAGES = [RECORD / "README.md", ROOT / "docs" / "study.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_tagged_number_equals_its_record(page):
    text = page.read_text(encoding="utf-8")
    assert study_numbers.quoted(text), f"{page.name} tags no number"
    assert study_numbers.check_page(RECORD, text) == []


def test_a_number_that_disagrees_with_its_record_is_reported():
    text = "Δ −1.94<!-- study_de_en_faithful/topk/delta/mean --> and −1.95<!-- study_de_en_faithful/topk/delta/mean -->, " \
           "+1.94<!-- study_de_en_faithful/topk/delta/mean -->, 1.0<!-- study_de_en_faithful/nothing/delta/1 -->"
    problems = study_numbers.check_page(RECORD, text)
    assert len(problems) == 3 and all("−1.94" not in p for p in problems)


def verdict_table(text):
    section = text.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| paper's")]


def test_the_verdict_tables_measured_numbers_are_all_tagged():
    rows = verdict_table((RECORD / "README.md").read_text(encoding="utf-8"))
    assert len(rows) >= 6
    for row in rows:
        measured = row.split(" | ")[1]
        untagged = re.sub(study_numbers.TAG, "", measured)
        assert not re.search(r"\d\.\d", untagged), f"untagged number in the verdict table: {measured}"
        for cell in row.strip("| ").split(" | "):
            assert len(re.sub(r"<!--.*?-->", "", cell).split()) <= 30, f"a verdict cell is a paragraph: {cell}"


def test_the_floors_are_t_lines_of_the_committed_records():
    floors = study_numbers.floors(RECORD)
    bleu = floors["bleu"]
    # softmax's BLEU: papers' recipe seeds 1-3 and the first recipe's seeds 1-2, each about its own mean
    faithful = list(study_numbers.seed_values(RECORD, "study_de_en_faithful", "softmax", "bleu").values())
    first = list(study_numbers.seed_values(RECORD, "study_de_en", "softmax", "bleu").values())
    assert (len(faithful), len(first)) == (3, 2) and bleu.df == 3
    squares = sum((x - sum(faithful) / 3) ** 2 for x in faithful) + sum((x - sum(first) / 2) ** 2 for x in first)
    assert bleu.sd == pytest.approx(math.sqrt(squares / 3))
    assert bleu.one == pytest.approx(3.182 * math.sqrt(2) * bleu.sd) and bleu.mean2 == pytest.approx(3.182 * bleu.sd)
    documents = floors["dbleu"]
    assert documents.df == 3 and documents.sd == pytest.approx(0.92, abs=0.005)
    assert documents.one == pytest.approx(4.15, abs=0.01) and documents.mean2 == pytest.approx(2.93, abs=0.01)
    assert floors["gap10"].df == 4 and floors["gap10"].t == pytest.approx(2.776)
    # 10-epoch BLEU: two seeds each of the dropout pair, three each of softmax and top-k
    bleu10 = floors["bleu10"]
    assert bleu10.df == 1 + 1 + 2 + 2 and bleu10.mean3 == pytest.approx(2.447 * math.sqrt(2 / 3) * bleu10.sd)
    # a paired continuation: two seeds each of the 2+2 softmax / hard retrieval pair and of the 6+2 L0Drop
    # pair, each row about its own mean
    rows = ("softmax_cont", "hard_cont", "l0drop_e6_cont", "l0drop_e6_cont_lambda0")
    continued = [list(study_numbers.seed_values(RECORD, "study_diagnosis", row, "bleu").values()) for row in rows]
    assert [len(g) for g in continued] == [2, 2, 2, 2] and floors["cont"].df == 4
    assert floors["cont"].sd == pytest.approx(math.sqrt(sum((a - b) ** 2 / 2 for a, b in continued) / 4))
    assert floors["cont"].delta_change == pytest.approx(2.776 * 2 * floors["cont"].sd)
    # the same pair trained twice per seed: a pair of runs per seed, 2 df
    rerun = floors["gap_rerun10"]
    assert rerun.df == 2 and rerun.change == pytest.approx(4.303 * math.sqrt(2) * rerun.sd)
    # the pair's gap over three seeds of study_diagnosis: its sample standard deviation, 2 df
    gaps = [study_numbers.valid_gap(RECORD, "study_diagnosis", "topk", seed, 10) for seed in (1, 2, 3)]
    assert floors["gap_seed10"].df == 2 and floors["gap_seed10"].sd == pytest.approx(statistics.stdev(gaps))


def paragraphs(text):
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(r"<!--.*?-->", "", text)
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if not line.lstrip().startswith("|")]
        items, current = [], []
        for line in lines:
            if re.match(r"\s*([-*]|\d+\.) ", line) and current:
                items.append(" ".join(current))
                current = []
            current.append(line)
        items.append(" ".join(current))
        yield from (item for item in items if item.strip())


def test_no_paragraph_of_the_study_readme_runs_past_200_words():
    long = [p[:80] for p in paragraphs((RECORD / "README.md").read_text(encoding="utf-8")) if len(p.split()) > 200]
    assert long == []
