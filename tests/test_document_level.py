"""Document-level translation: blocks of at most 512 tokens, un-blocking and d-BLEU.

The unit tests use synthetic documents; the end-to-end test groups Bible verses by
chapter (fairseq_sparse.data.bible --level document), packs them into blocks, trains a tiny
transformer_sparse_doc with window / Top-k (OOW) self-attention for a few updates, decodes
the blocks and scores d-BLEU over whole chapters.
"""

import importlib.util
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_sparse.data.document_blocks import split_block
from fairseq_sparse.evaluate import (
    corpus_bleu,
    document_bleu,
    documents_from_blocks,
    read_block_documents,
)

ROOT = Path(__file__).resolve().parents[1]
USER_DIR = str(ROOT / "fairseq_sparse")
BIN = Path(sys.executable).parent


def _load_document_blocks():
    return importlib.import_module("fairseq_sparse.data.document_blocks")


blocking = _load_document_blocks()


def random_documents(seed: int, num_documents: int = 12, longest: int = 120):
    """Parallel documents of 1-40 sentences of 0-``longest`` tokens each (many blocks long)."""
    rng = random.Random(seed)
    lengths = [n for n in (0, 1, 5, 20, 60, 120) if n <= longest]

    def sentence(side):
        return " ".join(f"{side}{rng.randrange(50)}" for _ in range(rng.choice(lengths)))

    sizes = [rng.randint(1, 40) for _ in range(num_documents)]
    return [[sentence("s") for _ in range(n)] for n in sizes], [[sentence("t") for _ in range(n)] for n in sizes]


def positions_taken(line: str) -> int:
    return len(line.split()) + 1  # fairseq appends </s>


# ------------------------------------------------------------ blocking


@pytest.mark.parametrize("max_tokens", [512, 64])
def test_blocking_round_trip_restores_every_sentence_in_order(max_tokens):
    src_docs, tgt_docs = random_documents(seed=max_tokens, longest=max_tokens - 1)
    blocks, src_lines, tgt_lines = blocking.make_blocks(src_docs, tgt_docs, max_tokens)
    assert len(blocks) > len(src_docs), "some documents must need several blocks"
    assert blocking.unblock(src_lines, blocks) == src_docs
    assert blocking.unblock(tgt_lines, blocks) == tgt_docs


@pytest.mark.parametrize("max_tokens", [512, 64])
def test_no_block_exceeds_the_limit_and_packing_is_greedy_within_documents(max_tokens):
    src_docs, tgt_docs = random_documents(seed=1)
    src_docs[0][0] = " ".join(["long"] * 700)  # longer than any block: cut to fit
    blocks, src_lines, tgt_lines = blocking.make_blocks(src_docs, tgt_docs, max_tokens)
    assert max(map(positions_taken, src_lines + tgt_lines)) <= max_tokens
    assert positions_taken(src_lines[0]) == max_tokens, "the over-long sentence fills its block exactly"
    for block, following in zip(blocks, blocks[1:]):
        if block.document != following.document:
            assert following.first_sentence == 0
            continue
        assert following.first_sentence == block.first_sentence + block.num_sentences
        # greedy: the next sentence did not fit into this block on one of the sides
        grown = [doc[block.document][block.first_sentence : following.first_sentence + 1] for doc in (src_docs, tgt_docs)]
        assert max(blocking.block_length([blocking.fit_sentence(s, max_tokens)[0] for s in side]) for side in grown) > max_tokens


def test_block_files_and_map(tmp_path):
    """Files in, files out: sentence counts, raw references, the map that evaluate reads."""
    src_docs, tgt_docs = random_documents(seed=3, num_documents=4)
    counts = [len(d) for d in src_docs]
    (tmp_path / "test.sentcount").write_text("\n".join(map(str, counts)) + "\n")
    for lang, docs in (("de", src_docs), ("en", tgt_docs)):
        (tmp_path / f"test.sentences.{lang}").write_text("\n".join(s for d in docs for s in d) + "\n")
        raw = (f"Doc {i} sentence {j}." for i, d in enumerate(docs) for j in range(len(d)))
        (tmp_path / f"test.sentences.raw.{lang}").write_text("\n".join(raw) + "\n")
    out = tmp_path / "blocks"
    assert blocking.main(["--in", str(tmp_path), "--out", str(out), "--src-lang", "de", "--tgt-lang", "en", "--splits", "test"]) == 0
    blocks = blocking.read_block_map(out / "test.blocks.tsv")
    assert read_block_documents(str(out / "test.blocks.tsv")) == [b.document for b in blocks]
    assert blocking.unblock((out / "test.en").read_text().splitlines(), blocks) == tgt_docs
    raw_documents = (out / "test.raw.en").read_text().splitlines()
    assert raw_documents[1] == " ".join(f"Doc 1 sentence {j}." for j in range(counts[1]))


def test_documents_separated_by_empty_lines_without_sentence_counts(tmp_path):
    path = tmp_path / "docs.en"
    path.write_text("a b\nc\n\nd e f\n\n\ng\n")
    assert blocking.read_documents(path, None) == [["a b", "c"], ["d e f"], ["g"]]
    with pytest.raises(blocking.BlockError, match="add up to 3"):
        blocking.read_documents(path, [1, 2])


# --------------------------------------------------------------- d-BLEU

REFERENCE_DOCUMENTS = [
    ["The quick brown fox jumps over the lazy dog .", "It was not amused at all .", "Then it slept ."],
    ["In the beginning was the Word .", "The Word was with God ."],
]


def test_d_bleu_of_a_perfect_translation_is_100():
    blocks, _, tgt_lines = blocking.make_blocks(REFERENCE_DOCUMENTS, REFERENCE_DOCUMENTS, max_tokens=16)
    assert len(blocks) > len(REFERENCE_DOCUMENTS), "documents are split over several blocks"
    references = [" ".join(d) for d in REFERENCE_DOCUMENTS]
    score, signature = document_bleu(tgt_lines, [b.document for b in blocks], references)
    assert score.score == pytest.approx(100.0)
    assert "tok:13a" in str(signature)


def test_d_bleu_matches_whole_documents_not_sentences():
    """A translation that moves sentence boundaries: every document's words and order are right,
    so d-BLEU is 100, while BLEU over the (misaligned) sentences is far below."""
    hypothesis_sentences = [
        ["The quick brown fox jumps over", "the lazy dog . It was not amused", "at all . Then it slept ."],
        ["In the beginning was the Word . The Word", "was with God ."],
    ]
    references = [" ".join(d) for d in REFERENCE_DOCUMENTS]
    blocks = [" <sep> ".join(d) for d in hypothesis_sentences]
    d_bleu, _ = document_bleu(blocks, [0, 1], references)
    sentence_bleu, _ = corpus_bleu(sum(hypothesis_sentences, []), sum(REFERENCE_DOCUMENTS, []))
    assert d_bleu.score == pytest.approx(100.0)
    assert sentence_bleu.score < 75.0  # 64.5: n-grams across the moved boundaries are lost
    # sentences put into the wrong document lower d-BLEU although the sentence multiset is the same
    swapped = [" <sep> ".join(REFERENCE_DOCUMENTS[0][:2] + REFERENCE_DOCUMENTS[1][1:]),
               " <sep> ".join(REFERENCE_DOCUMENTS[1][:1] + REFERENCE_DOCUMENTS[0][2:])]
    assert document_bleu(swapped, [0, 1], references)[0].score < 90.0


def test_unblocking_joins_blocks_in_order_and_detokenises_each_sentence():
    blocks = ["Hello , world ! <sep> He said : \" yes \" .", "Bye ."]

    def moses_like(sentence):
        return sentence.replace(" ,", ",").replace(" !", "!").replace(" .", ".").replace(" :", ":")

    assert documents_from_blocks(blocks, [0, 0], moses_like) == ['Hello, world! He said: " yes ". Bye.']
    assert split_block("<sep> a b <sep> <sep> c", drop_empty=True) == ["a b", "c"]  # translated: stray separators
    assert split_block("<sep> a b <sep> <sep> c") == ["", "a b", "", "c"]  # written by blocks_of: counted
    with pytest.raises(ValueError, match="2 translated blocks but 3"):
        documents_from_blocks(blocks, [0, 0, 1])
    with pytest.raises(ValueError, match="in order"):
        documents_from_blocks(blocks, [1, 0])


def test_evaluate_command_prints_d_bleu_and_signature(tmp_path):
    blocks, _, tgt_lines = blocking.make_blocks(REFERENCE_DOCUMENTS, REFERENCE_DOCUMENTS, max_tokens=16)
    blocking.write_block_map(tmp_path / "test.blocks.tsv", blocks, ["a", "b"])
    (tmp_path / "gen.out").write_text("".join(f"D-{i}\t-0.5\t{line}\n" for i, line in enumerate(tgt_lines)))
    (tmp_path / "ref.en").write_text("\n".join(" ".join(d) for d in REFERENCE_DOCUMENTS) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "fairseq_sparse.evaluate", tmp_path / "gen.out", tmp_path / "ref.en", "--detok", "none",
         "--documents", tmp_path / "test.blocks.tsv"], capture_output=True, text=True, check=True,
    )
    assert "d-BLEU = 100.00" in result.stdout and "over 2 documents" in result.stdout
    assert re.search(r"sacreBLEU signature: nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:", result.stdout)


# ----------------------------------------------------------- end to end


def run(tool, *args):
    result = subprocess.run([str(BIN / tool), *map(str, args)], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise AssertionError(f"{tool} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def bible_blocks(tmp_path_factory):
    """Bible chapters (de-en) -> blocks of <= 512 tokens -> binarised with a joined dictionary."""
    chapters, out = tmp_path_factory.mktemp("bible-doc"), tmp_path_factory.mktemp("bible-blocks")
    subprocess.run(
        [sys.executable, "-m", "fairseq_sparse.data.bible", "--pair", "de-en", "--level", "document", "--out", str(chapters),
         "--max-train-pairs", "60", "--max-eval-pairs", "5", "--bpe-merges", "1000", "--max-len", "100000"],
        check=True, capture_output=True, timeout=900,
    )
    assert blocking.main(["--in", str(chapters), "--out", str(out), "--src-lang", "de", "--tgt-lang", "en"]) == 0
    run("fairseq-preprocess", "--source-lang", "de", "--target-lang", "en", "--joined-dictionary", "--workers", "1",
        "--trainpref", out / "train", "--validpref", out / "valid", "--testpref", out / "test", "--destdir", out / "bin")
    return chapters, out


def test_bible_chapters_round_trip_through_blocks(bible_blocks):
    chapters, out = bible_blocks
    counts = [int(n) for n in (chapters / "test.sentcount").read_text().split()]
    verses = (chapters / "test.sentences.en").read_text().splitlines()
    blocks = blocking.read_block_map(out / "test.blocks.tsv")
    documents = blocking.unblock((out / "test.en").read_text().splitlines(), blocks)
    assert [len(d) for d in documents] == counts and sum(documents, []) == verses
    assert len(blocks) > len(counts), "Bible chapters need several 512-token blocks"
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            assert max(map(positions_taken, (out / f"{split}.{lang}").read_text().splitlines())) <= 512
    assert (out / "test.raw.en").read_text().splitlines() == (chapters / "test.raw.en").read_text().splitlines()


def test_train_generate_and_score_d_bleu_on_bible_chapters(bible_blocks, tmp_path):
    _, out = bible_blocks
    save_dir = tmp_path / "checkpoints"
    log = run(
        "fairseq-train", out / "bin", "--user-dir", USER_DIR, "--arch", "transformer_sparse_doc",
        "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "4", "--share-all-embeddings",
        "--encoder-attn-fn", "window", "--decoder-attn-fn", "topk_oow", "--attn-k", "8",
        "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "2048", "--max-update", "3", "--disable-validation",
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--cpu", "--log-format", "simple", "--log-interval", "1", "--seed", "1",
    )
    assert "num_updates 3" in log and "nan" not in re.findall(r"loss[= ](\S+)", log)
    # --required-batch-size-multiple 1: fairseq otherwise drops a last batch smaller than 8 (fairseq issue 5036)
    generated = run(
        "fairseq-generate", out / "bin", "--user-dir", USER_DIR, "--path", save_dir / "checkpoint_last.pt", "--beam", "2",
        "--batch-size", "32", "--required-batch-size-multiple", "1", "--max-len-a", "0", "--max-len-b", "40",
        "--cpu", "--post-process", "subword_nmt",
    )
    (tmp_path / "generate.log").write_text(generated)
    scored = subprocess.run(
        [sys.executable, "-m", "fairseq_sparse.evaluate", tmp_path / "generate.log", out / "test.raw.en", "--lang", "en",
         "--documents", out / "test.blocks.tsv", "--hypotheses-out", tmp_path / "documents.en"],
        capture_output=True, text=True, check=True,
    )
    print(scored.stdout)
    assert re.search(r"^d-BLEU = \d+\.\d\d .* over 5 documents$", scored.stdout, flags=re.M), scored.stdout
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0" in scored.stdout
    assert len((tmp_path / "documents.en").read_text().splitlines()) == 5
