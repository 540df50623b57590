"""fairseq_sparse.evaluate on hand-written fairseq-generate output."""

import pytest

from fairseq_sparse.evaluate import main, read_hypotheses

# fairseq-generate --nbest 3: sentences in batch order, each id's hypotheses best first
NBEST_3 = """\
S-1\tein Hund .
T-1\ta dog .
H-1\t-0.20\ta dog .
D-1\t-0.20\ta dog .
P-1\t-0.1 -0.2 -0.3 -0.2
H-1\t-0.90\tthe dog .
D-1\t-0.90\tthe dog .
P-1\t-0.5 -0.9 -1.2 -1.0
H-1\t-1.70\ta dog@@ gy
D-1\t-1.70\ta dog@@ gy
P-1\t-0.5 -2.9 -1.2 -2.0
S-0\tdie Katze schläft .
T-0\tthe cat sleeps .
H-0\t-0.10\tthe cat sleeps .
D-0\t-0.10\tthe cat sleeps .
P-0\t-0.1 -0.1 -0.1 -0.1 -0.1
H-0\t-1.10\tthe cat sleep .
D-0\t-1.10\tthe cat sleep .
P-0\t-0.1 -0.1 -3.1 -0.1 -0.1
H-0\t-2.40\ta cat ,
D-0\t-2.40\ta cat ,
P-0\t-0.1 -3.1 -3.1 -3.1 -3.1
Generate test with beam=3: BLEU4 = 12.34
"""


def test_nbest_output_scores_the_best_hypothesis_of_each_sentence(tmp_path):
    log = tmp_path / "generate.log"
    log.write_text(NBEST_3, encoding="utf-8")
    assert read_hypotheses(str(log), "en") == ["the cat sleeps.", "a dog."]
    references = tmp_path / "ref.en"
    references.write_text("the cat sleeps.\na dog.\n", encoding="utf-8")
    assert main([str(log), str(references), "--lang", "en"]) == pytest.approx(100.0)
