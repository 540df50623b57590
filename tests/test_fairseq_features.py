"""Every decoding and training feature of stock fairseq's transformer, for every attention method.

A rewrite (not a copy) of fairseq 0.12's own translation tests: ``tests/test_binaries.py``
(TestTranslation: training, --checkpoint-activations, generation options, fairseq-interactive,
constrained decoding), ``tests/test_sequence_generator.py`` (beam search, sampling, diverse beam
search, diversity rate, prefix, length and n-gram options, scoring) and
``tests/test_inference_dropout.py`` (--retain-dropout), pointed at this plugin's architectures.

Methods (columns): every registered attention function (``attention_cases.NAMES``; a function
defined for self-attention only runs in encoder and decoder self-attention, softmax in
cross-attention), ``l0drop`` (an L0Drop model, decoded from its compressed memory as
fairseq-generate does by default), and ``stock``, fairseq's own ``--arch transformer`` of the same
sizes, the reference row. Each method's tiny model is trained once (three updates on the tiny Bible
bitext of ``conftest.bible``, dropout 0.1) and decodes eight test sentences with fairseq-generate,
fairseq-interactive and the hub interface, all in this process. Decodings are cached by their
options, so features checked on the same decoding share one run. Finally the plugin's softmax and
stock's transformer, given the same weights, must decode alike.

Scores printed by fairseq-generate are base 2; ``model_log_probs`` gives the model's own
(teacher-forced, one hypothesis alone) in the same base, against which most checks compare the
decoder's positional scores: a wrong cache reorder in beam search shows there.
"""

import contextlib
import copy
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
import torch
from fairseq import checkpoint_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models.transformer import TransformerModel
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq_cli import generate as fairseq_generate
from fairseq_cli import interactive as fairseq_interactive
from omegaconf import OmegaConf

from attention_cases import CASES, NAMES
from helpers import run_in_process
from fairseq_sparse.core.models.sparse_transformer import SparseTransformerModel

ROOT = Path(__file__).resolve().parents[1]
USER_DIR = str(ROOT / "fairseq_sparse")
METHODS = [*NAMES, "l0drop", "stock"]
STOCK_FROM_SOFTMAX = "stock transformer with the softmax model's weights"
DECODED_SENTENCES = 8
ATOL = 2e-3  # positional scores are printed with 4 decimals; incremental and full passes differ in float rounding

# a data loader worker process costs about 5 s of waiting when its iterator is dropped unfinished
NO_WORKERS = ["--num-workers", "0"]
# test_end_to_end's TINY_MODEL sizes, two layers each side as transformer_sparse_mini has
TINY_SIZES = [
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--encoder-layers", "2", "--decoder-layers", "2", "--share-all-embeddings",
]
TRAINING = [
    # fairseq's own test_binaries trains with NAG: Adam's first steps (about lr x the sign of the gradient)
    # would turn the rounding noise of gradients that are zero in exact arithmetic (key biases: softmax and
    # top-k ignore a shift of all scores) into different weights with and without --checkpoint-activations
    "--optimizer", "nag", "--lr", "0.05", "--max-tokens", "2000", "--max-update", "3", "--cpu", "--seed", "1",
    # dropout on, so that --retain-dropout has something to retain
    "--dropout", "0.1", "--no-epoch-checkpoints", "--no-save-optimizer-state", "--log-format", "none",
    "--required-batch-size-multiple", "1", *NO_WORKERS,
]
# short hypotheses keep decoding fast; the model is barely trained, so they are mostly repetitions
MAX_LEN = ("--max-len-a", "0", "--max-len-b", "12")

# One decoding per row; several features are read off one decoding where their options combine.
BEAM = ("--beam", "4", "--nbest", "2")
SAMPLING_TOPK = ("--sampling", "--sampling-topk", "3", "--beam", "2", "--nbest", "2")
SAMPLING_TOPP = ("--sampling", "--sampling-topp", "0.5", "--beam", "2", "--nbest", "2")
DIVERSE_BEAM = ("--diverse-beam-groups", "2", "--beam", "4", "--nbest", "4")
DIVERSITY_RATE = ("--diversity-rate", "0.5", "--beam", "4", "--nbest", "4")
PREFIX = ("--prefix-size", "2", "--beam", "4")
MATCH_SOURCE_LEN = ("--match-source-len", "--beam", "4")
NO_REPEAT_AND_LENPEN = ("--no-repeat-ngram-size", "2", "--lenpen", "0.6", "--beam", "4")
# an unknown-word reward of 100 (a negative penalty) makes <unk> win every step the length bound allows
# (the last --max-len-b given, 3, overrides MAX_LEN's)
MAX_LEN_3_AND_UNK_REWARD = ("--max-len-a", "0", "--max-len-b", "3", "--unkpen=-100", "--beam", "4")
SCORE_REFERENCE = ("--score-reference",)
ALIGNMENT = ("--print-alignment", "--beam", "4")
# fairseq-generate's command line gives --retain-dropout-modules as one string, which fairseq's
# FairseqDropout searches (`module_name in retain_dropout_modules`): stock's layer class name
RETAINED_DROPOUT = ("--retain-dropout", "--retain-dropout-modules", "TransformerDecoderLayerBase")


@dataclass
class Hypothesis:
    tokens: List[str]
    score: float  # base 2
    positional_scores: List[float] = field(default_factory=list)  # one per token and the final eos, base 2
    alignment: List[Tuple[int, int]] = field(default_factory=list)  # (source index, hypothesis index)
    steps: Optional[int] = None


@dataclass
class Sentence:
    source: List[str] = field(default_factory=list)
    reference: List[str] = field(default_factory=list)
    hypotheses: List[Hypothesis] = field(default_factory=list)


def parse_hypotheses(output: str) -> List[Sentence]:
    """fairseq-generate's / fairseq-interactive's S-, T-, H-, P-, A- and I- lines, by sentence id."""
    sentences: Dict[int, Sentence] = {}
    for kind, sentence_id, text in re.findall(r"^([STHPAI])-(\d+)\t(.*)$", output, flags=re.M):
        sentence = sentences.setdefault(int(sentence_id), Sentence())
        if kind == "S":
            sentence.source = text.split()
        elif kind == "T":
            sentence.reference = text.split()
        elif kind == "H":
            score, _, tokens = text.partition("\t")
            sentence.hypotheses.append(Hypothesis(tokens.split(), float(score)))
        elif kind == "P":
            sentence.hypotheses[-1].positional_scores = [float(s) for s in text.split()]
        elif kind == "A":
            sentence.hypotheses[-1].alignment = [tuple(map(int, pair.split("-"))) for pair in text.split()]
        else:
            sentence.hypotheses[-1].steps = int(text)
    return [sentences[i] for i in sorted(sentences)]


def run_cli(main, parser, argv: Sequence[str]) -> str:
    """A fairseq command's ``main`` in this process (no 4 s of imports), its printed output."""
    args = options.parse_args_and_arch(parser, input_args=[str(a) for a in argv])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(convert_namespace_to_omegaconf(args))
    return printed.getvalue()


def model_options(method: str) -> List[str]:
    if method == "stock":
        return ["--arch", "transformer", *TINY_SIZES]
    plugin = ["--user-dir", USER_DIR, "--arch", "transformer_sparse_mini", *TINY_SIZES]
    if method == "l0drop":
        # as docs/l0drop.md trains it (from scratch here): gated encoder outputs, the L0 criterion
        return [*plugin, "--l0drop", "--criterion", "label_smoothed_cross_entropy_l0drop", "--label-smoothing", "0.1",
                "--l0-lambda", "0.3"]
    cross = "softmax" if CASES[method].self_only else method
    return [*plugin, "--encoder-attn-fn", method, "--decoder-attn-fn", method, "--cross-attn-fn", cross, "--attn-k", "4"]


def user_dir_options(method: str) -> List[str]:
    """What a user gives fairseq-generate / fairseq-interactive for the method's checkpoint."""
    return [] if method in ("stock", STOCK_FROM_SOFTMAX) else ["--user-dir", USER_DIR]


def stock_copy_of(checkpoint: Path, out: Path) -> Path:
    """The checkpoint with its model named fairseq's ``transformer``: same options, same weights (the
    plugin's softmax keeps fairseq's parameter names), built by stock fairseq's TransformerModel."""
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    cfg = OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True)
    cfg["model"]._name = cfg["model"].arch = "transformer"
    cfg["common"]["user_dir"] = None
    torch.save({**state, "cfg": cfg}, out)
    return out


def losses(checkpoint: Path) -> Tuple[float, float, int]:
    """Mean training loss, validation loss (base 2, per token) and updates stored in a checkpoint."""
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    metrics = state["extra_state"]["metrics"]

    def mean(aggregator: str, name: str) -> float:
        meter = next(m for _, key, _, m in metrics[aggregator] if key == name)
        return float(meter["sum"]) / meter["count"]

    return mean("train", "loss"), mean("valid", "loss"), state["optimizer_history"][-1]["num_updates"]


class Lab:
    """Trains each method's model once and runs each decoding once; tests read the cached results."""

    def __init__(self, bible: Path, work: Path):
        self.data, self.work = bible / "bin", work
        self.decode_data = self._first_test_sentences(bible, work / "decode-bin")
        # the same sentences as text (BPE'd), as fairseq-interactive and the hub read them
        self.sources = (work / "first.de").read_text(encoding="utf-8").splitlines()
        self._checkpoints: Dict[Tuple[str, bool], Path] = {}
        self._decodings: Dict[Tuple[str, Tuple[str, ...]], List[Sentence]] = {}
        self._models: Dict[str, torch.nn.Module] = {}
        self._inputs = 0

    def _first_test_sentences(self, bible: Path, out: Path) -> Path:
        """The first DECODED_SENTENCES test pairs, binarised with the bitext's dictionaries."""
        prefix = self.work / "first"
        for lang in ("de", "en"):
            lines = (bible / f"test.{lang}").read_text(encoding="utf-8").splitlines()[:DECODED_SENTENCES]
            Path(f"{prefix}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        run_in_process("fairseq-preprocess", "--source-lang", "de", "--target-lang", "en", "--testpref", prefix,
                       "--srcdict", self.data / "dict.de.txt", "--tgtdict", self.data / "dict.en.txt",
                       "--destdir", out, "--workers", "1")
        return out

    def checkpoint(self, method: str, checkpoint_activations: bool = False, cross_self_attention: bool = False) -> Path:
        key = (method, checkpoint_activations, cross_self_attention)
        if key not in self._checkpoints:
            if method == STOCK_FROM_SOFTMAX:
                self._checkpoints[key] = stock_copy_of(self.checkpoint("softmax"), self.work / "stock-from-softmax.pt")
            else:
                save_dir = self.work / (f"{method}{'-checkpoint-activations' if checkpoint_activations else ''}"
                                        f"{'-cross-self-attention' if cross_self_attention else ''}")
                extra = (["--checkpoint-activations"] if checkpoint_activations else []) + (
                    ["--cross-self-attention"] if cross_self_attention else [])
                run_in_process("fairseq-train", self.data, *model_options(method), *TRAINING, *extra, "--save-dir", save_dir)
                self._checkpoints[key] = save_dir / "checkpoint_last.pt"
        return self._checkpoints[key]

    def decode(self, method: str, *decoding: str, seed: int = 1) -> List[Sentence]:
        """fairseq-generate on the first test sentences, one batch."""
        key = (method, (*decoding, f"seed={seed}"))
        if key not in self._decodings:
            output = run_cli(fairseq_generate.main, options.get_generation_parser(), [
                self.decode_data, *user_dir_options(method), "--path", self.checkpoint(method), "--cpu", "--seed", seed,
                "--batch-size", DECODED_SENTENCES, "--required-batch-size-multiple", "1", *NO_WORKERS, *MAX_LEN, *decoding,
            ])
            self._decodings[key] = parse_hypotheses(output)
            assert len(self._decodings[key]) == DECODED_SENTENCES, output[-3000:]
        return self._decodings[key]

    def interactive(self, method: str, lines: Sequence[str], *decoding: str) -> List[Sentence]:
        self._inputs += 1
        source = self.work / f"interactive-input-{self._inputs}.txt"
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        output = run_cli(fairseq_interactive.main, options.get_interactive_generation_parser(), [
            self.data, *user_dir_options(method), "--path", self.checkpoint(method), "--cpu", "--source-lang", "de",
            "--target-lang", "en", "--input", source, "--buffer-size", len(lines), "--batch-size", len(lines),
            *NO_WORKERS, *MAX_LEN, *decoding,
        ])
        sentences = parse_hypotheses(output)
        assert len(sentences) == len(lines), output[-3000:]
        return sentences

    def model(self, method: str) -> torch.nn.Module:
        """The method's trained model in evaluation mode, as fairseq-generate loads it."""
        if method not in self._models:
            self._models[method] = load_model(self.checkpoint(method))
        return self._models[method]


def load_model(checkpoint: Path) -> torch.nn.Module:
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    return models[0].eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run several times faster on one thread on a small shared machine (OpenMP threads
    otherwise spin against each other); the setting is put back for the other test files."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def lab(bible, tmp_path_factory) -> Lab:
    return Lab(bible, tmp_path_factory.mktemp("fairseq-features"))


# Another score this close to a top-k threshold (relative) makes the selection depend on float32
# rounding: the search computes the same scores in other batch shapes, whose products round about 1e-7
# apart, and may keep the other key.
NEAR_TIE = 1e-5


@contextlib.contextmanager
def top_k_near_ties():
    """Yield a list that gets, for every top-k selection run meanwhile, whether a score other than the
    k-th largest lay within NEAR_TIE of it in some row."""
    from fairseq_sparse.core.attention import functions

    exact = functions.kth_largest
    seen: List[bool] = []

    def recording(masked, k, key_counts=None, **options):
        kth = exact(masked, k, key_counts, **options)
        close = torch.isfinite(masked) & ((masked - kth).abs() <= NEAR_TIE * kth.abs().clamp(min=1.0))
        seen.append(bool(close.sum(dim=-1).gt(1).any()))
        return kth

    functions.kth_largest = recording
    try:
        yield seen
    finally:
        functions.kth_largest = exact


def model_log_probs(model, source: Sequence[str], hypothesis: Sequence[str],
                    near_ties: Optional[List[bool]] = None) -> torch.Tensor:
    """(len(hypothesis) + 1, V): the model's log-probabilities in base 2 at each hypothesis position and
    its final eos, the model decoding this one hypothesis step by step (teacher-forced, no search).
    ``near_ties``, if given, gets for each position whether a top-k selection of its step (or of the
    encoder) had a near-tie (``top_k_near_ties``).

    Incremental, as the search computes them: a hard selection (top-k, argmax) of a model trained for
    three updates has near-ties (a k-th and (k+1)-th score 1e-7 apart), which the full pass, rounding
    otherwise in float32, can break the other way (0.036 on one top-k token; in float64 both passes agree
    to 1e-7). The search's batch shapes round otherwise too, so such a position can still differ from it
    (on a CPU with AMX, by 0.036 on one top-k token): ``near_ties`` marks them. That incremental decoding
    equals the full pass is tests/core/models/test_sublayers.py's check."""
    dictionary = model.decoder.dictionary
    source_ids = [model.encoder.dictionary.index(t) for t in source] + [dictionary.eos()]
    previous = torch.tensor([[dictionary.eos()] + [dictionary.index(t) for t in hypothesis]])
    state: Dict[str, Dict[str, Optional[torch.Tensor]]] = {}
    steps = []
    with torch.no_grad(), top_k_near_ties() as seen:
        encoder_out = model.encoder(torch.tensor([source_ids]), src_lengths=torch.tensor([len(source_ids)]))
        encoder_tied = any(seen)
        for end in range(1, previous.size(1) + 1):
            seen.clear()
            steps.append(model.decoder(previous[:, :end], encoder_out=encoder_out, incremental_state=state))
            if near_ties is not None:
                near_ties.append(encoder_tied or any(seen))
        logits = torch.cat([out[0][:, -1:] for out in steps], dim=1)
        return model.get_normalized_probs((logits, None), log_probs=True)[0] / math.log(2)


def token_ids(model, hypothesis: Hypothesis) -> torch.Tensor:
    dictionary = model.decoder.dictionary
    return torch.tensor([dictionary.index(t) for t in hypothesis.tokens] + [dictionary.eos()])


def scores_by_the_model(model, sentence: Sentence, hypothesis: Hypothesis,
                        near_ties: Optional[List[bool]] = None) -> List[float]:
    """What the model itself gives each token of the hypothesis and its eos (base 2); ``near_ties`` as
    ``model_log_probs``'s."""
    lprobs = model_log_probs(model, sentence.source, hypothesis.tokens, near_ties)
    return lprobs.gather(1, token_ids(model, hypothesis)[:, None])[:, 0].tolist()


def assert_scored_by_the_model(model, sentence: Sentence, hypothesis: Hypothesis):
    """The search's score of every position is the model's, but where a top-k selection of that step
    had a near-tie (the search may round it the other way); at most a quarter of them may have one."""
    near_ties: List[bool] = []
    by_model = scores_by_the_model(model, sentence, hypothesis, near_ties)
    assert sum(near_ties) <= len(near_ties) / 4
    compared = [(given, own) for given, own, tied in zip(hypothesis.positional_scores, by_model, near_ties) if not tied]
    assert [given for given, _ in compared] == pytest.approx([own for _, own in compared], abs=ATOL)


def bigrams(tokens: Sequence[str]) -> List[Tuple[str, str]]:
    return list(zip(tokens, tokens[1:]))


# ---------------------------------------------------------------- training (test_binaries.TestTranslation)


@pytest.mark.parametrize("method", METHODS)
def test_training_a_few_updates_then_validation_gives_finite_losses(lab, method):
    train_loss, valid_loss, updates = losses(lab.checkpoint(method))
    assert updates == 3
    assert math.isfinite(train_loss) and math.isfinite(valid_loss) and valid_loss > 0


@pytest.mark.parametrize("method", METHODS)
def test_checkpoint_activations_train_to_the_same_losses(lab, method):
    """fairseq's activation checkpointing recomputes each layer in the backward pass with the random
    state of the forward pass: the same seed gives the same losses, dropout (0.1) included."""
    plain = losses(lab.checkpoint(method))
    recomputed = losses(lab.checkpoint(method, checkpoint_activations=True))
    assert recomputed == pytest.approx(plain, rel=1e-5)


# ---------------------------------------------------------------- search (test_sequence_generator)


@pytest.mark.parametrize("method", METHODS)
def test_beam_search_gives_nbest_hypotheses_sorted_and_scored_by_the_model(lab, method):
    model = lab.model(method)
    for sentence in lab.decode(method, *BEAM):
        assert len(sentence.hypotheses) == 2
        scores = [h.score for h in sentence.hypotheses]
        assert scores == sorted(scores, reverse=True)
        for hypothesis in sentence.hypotheses:
            # length penalty 1: the score is the mean token score
            mean = sum(hypothesis.positional_scores) / len(hypothesis.positional_scores)
            assert hypothesis.score == pytest.approx(mean, abs=ATOL)
            assert_scored_by_the_model(model, sentence, hypothesis)


@pytest.mark.parametrize("method", [m for m in METHODS if m not in CASES or not CASES[m].self_only])
def test_cross_self_attention_trains_and_beam_search_scores_as_the_model(lab, method):
    """fairseq's --cross-self-attention (the decoder's self-attention over the source states and the target
    prefix together): three updates train to finite losses, and beam search, which reorders the cache that
    holds the source keys from the first step, scores every token as the model does (L0Drop decodes
    uncompressed: that self-attention reads the memory without its key counts)."""
    checkpoint = lab.checkpoint(method, cross_self_attention=True)
    train_loss, valid_loss, updates = losses(checkpoint)
    assert updates == 3 and math.isfinite(train_loss) and math.isfinite(valid_loss)
    model = load_model(checkpoint)
    assert model.decoder.cross_self_attention
    output = run_cli(fairseq_generate.main, options.get_generation_parser(), [
        lab.decode_data, *user_dir_options(method), "--path", checkpoint, "--cpu", "--batch-size", DECODED_SENTENCES,
        "--required-batch-size-multiple", "1", *NO_WORKERS, *MAX_LEN, *BEAM])
    sentences = parse_hypotheses(output)
    assert len(sentences) == DECODED_SENTENCES
    compared = tied = 0
    for sentence in sentences:
        for hypothesis in sentence.hypotheses:
            near_ties: List[bool] = []
            by_model = scores_by_the_model(model, sentence, hypothesis, near_ties)
            for given, own, near_tie in zip(hypothesis.positional_scores, by_model, near_ties):
                # a near-tie of a top-k selection may round the other way in the search (model_log_probs)
                tied += near_tie
                compared += not near_tie
                assert near_tie or given == pytest.approx(own, abs=ATOL)
    assert compared >= tied   # the top-k encoder of a few sentences has a near-tie: most positions are compared


@pytest.mark.parametrize("method", [m for m in NAMES if CASES[m].self_only])
def test_cross_self_attention_is_refused_for_a_pattern_over_one_sequence(lab, method):
    with pytest.raises(Exception, match=rf"--cross-self-attention: decoder self-attention function '{method}'"):
        lab.checkpoint(method, cross_self_attention=True)


@pytest.mark.xfail(strict=True, raises=KeyError, reason=(
    "fairseq 0.12: --print-step prints hypo['steps'], which only the iterative refinement generator of "
    "non-autoregressive models sets; SequenceGenerator's hypotheses have none (stock's transformer too)"))
@pytest.mark.parametrize("method", METHODS)
def test_print_step_gives_the_step_of_each_hypothesis_eos(lab, method):
    for sentence in lab.decode(method, *BEAM, "--print-step"):
        assert [h.steps for h in sentence.hypotheses] == [len(h.tokens) for h in sentence.hypotheses]


def allowed_tokens(lprobs_at: torch.Tensor, position: int, model) -> torch.Tensor:
    """The search's choice at one position: fairseq never emits pad, nor eos before --min-len (1)."""
    dictionary = model.decoder.dictionary
    allowed = lprobs_at.clone()
    allowed[dictionary.pad()] = -math.inf
    if position == 0:
        allowed[dictionary.eos()] = -math.inf
    return allowed


def sampled_tokens(lab, method: str, decoding: Sequence[str]):
    """(log-probabilities the sampler chose from, base 2, and the chosen token id) at every position of
    every hypothesis of a sampling decoding; the last eos may be forced by the length bound."""
    model = lab.model(method)
    for sentence in lab.decode(method, *decoding):
        assert len(sentence.hypotheses) == 2
        for hypothesis in sentence.hypotheses:
            lprobs = model_log_probs(model, sentence.source, hypothesis.tokens)
            ids = token_ids(model, hypothesis)
            for position in range(len(hypothesis.tokens)):
                yield allowed_tokens(lprobs[position], position, model), ids[position]
            assert_scored_by_the_model(model, sentence, hypothesis)


@pytest.mark.parametrize("method", METHODS)
def test_sampling_topk_draws_each_token_from_the_k_most_likely(lab, method):
    for allowed, chosen in sampled_tokens(lab, method, SAMPLING_TOPK):
        assert (allowed > allowed[chosen] + 1e-4).sum().item() < 3


@pytest.mark.parametrize("method", METHODS)
def test_sampling_topp_draws_each_token_from_the_nucleus(lab, method):
    for allowed, chosen in sampled_tokens(lab, method, SAMPLING_TOPP):
        probs = allowed.exp2()
        # fairseq keeps the most likely tokens until their mass reaches p, that one included
        assert probs[probs > probs[chosen] * (1 + 1e-4)].sum().item() < 0.5 + 1e-4


@pytest.mark.parametrize("method", METHODS)
def test_diverse_beam_search_keeps_one_group_unpenalised(lab, method):
    """--diverse-beam-groups 2: four distinct sorted hypotheses; the second group's scores carry a
    penalty for tokens the first chose, the first group's are the model's own."""
    model = lab.model(method)
    for sentence in lab.decode(method, *DIVERSE_BEAM):
        assert len(sentence.hypotheses) == 4
        assert len({tuple(h.tokens) for h in sentence.hypotheses}) == 4
        scores = [h.score for h in sentence.hypotheses]
        assert scores == sorted(scores, reverse=True)
        unpenalised = 0
        for hypothesis in sentence.hypotheses:
            by_model = scores_by_the_model(model, sentence, hypothesis)
            assert all(s <= m + ATOL for s, m in zip(hypothesis.positional_scores, by_model))
            unpenalised += hypothesis.positional_scores == pytest.approx(by_model, abs=ATOL)
        assert unpenalised >= 1


@pytest.mark.parametrize("method", METHODS)
def test_diversity_rate_penalises_each_sibling_by_its_rank(lab, method):
    """--diversity-rate 0.5 (Li et al., 2016): after the first step each token's score is the model's
    minus 0.5 x its rank among its siblings (1, 2, ...)."""
    model = lab.model(method)
    for sentence in lab.decode(method, *DIVERSITY_RATE):
        assert len(sentence.hypotheses) == 4
        for hypothesis in sentence.hypotheses:
            by_model = scores_by_the_model(model, sentence, hypothesis)
            assert hypothesis.positional_scores[0] == pytest.approx(by_model[0], abs=ATOL)
            for given, own in zip(hypothesis.positional_scores[1:], by_model[1:]):
                rank = (own - given) * math.log(2) / 0.5  # in nats, as the penalty is applied
                assert rank == pytest.approx(round(rank), abs=1e-2) and round(rank) >= 1


@pytest.mark.parametrize("method", METHODS)
def test_prefix_size_starts_each_hypothesis_with_the_reference(lab, method):
    model = lab.model(method)
    for sentence in lab.decode(method, *PREFIX):
        for hypothesis in sentence.hypotheses:
            assert hypothesis.tokens[:2] == sentence.reference[:2]
            assert_scored_by_the_model(model, sentence, hypothesis)


@pytest.mark.parametrize("method", METHODS)
def test_match_source_len_gives_hypotheses_as_long_as_the_source(lab, method):
    for sentence in lab.decode(method, *MATCH_SOURCE_LEN):
        # fairseq counts the source's eos: one token more than the printed source
        assert [len(h.tokens) for h in sentence.hypotheses] == [len(sentence.source) + 1]


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "fairseq 0.12's NGramRepeatBlock without its CUDA extension compares the last n-1 entries of the whole "
    "token buffer (padding) instead of the last generated tokens, so it bans nothing "
    "(facebookresearch/fairseq#4709); stock's transformer repeats bigrams too"))
@pytest.mark.parametrize("method", METHODS)
def test_no_repeat_ngram_size_leaves_no_bigram_twice(lab, method):
    for sentence in lab.decode(method, *NO_REPEAT_AND_LENPEN):
        for hypothesis in sentence.hypotheses:
            pairs = bigrams(hypothesis.tokens)
            assert len(set(pairs)) == len(pairs), hypothesis.tokens


@pytest.mark.parametrize("method", METHODS)
def test_lenpen_divides_the_score_by_length_to_its_power(lab, method):
    for sentence in lab.decode(method, *NO_REPEAT_AND_LENPEN):
        for hypothesis in sentence.hypotheses:
            length = len(hypothesis.positional_scores)
            assert hypothesis.score == pytest.approx(sum(hypothesis.positional_scores) / length ** 0.6, abs=ATOL)


@pytest.mark.parametrize("method", METHODS)
def test_max_len_bounds_the_hypothesis_length(lab, method):
    for sentence in lab.decode(method, *MAX_LEN_3_AND_UNK_REWARD):
        assert all(len(h.tokens) <= 3 for h in sentence.hypotheses)


@pytest.mark.parametrize("method", METHODS)
def test_unkpen_changes_the_unknown_words_score(lab, method):
    for sentence in lab.decode(method, *MAX_LEN_3_AND_UNK_REWARD):
        assert [h.tokens for h in sentence.hypotheses] == [["<unk>"] * 3]


@pytest.mark.parametrize("method", METHODS)
def test_score_reference_scores_the_reference_as_the_model_does(lab, method):
    model = lab.model(method)
    for sentence in lab.decode(method, *SCORE_REFERENCE):
        [hypothesis] = sentence.hypotheses
        assert hypothesis.tokens == sentence.reference
        assert_scored_by_the_model(model, sentence, hypothesis)


@pytest.mark.parametrize("method", METHODS)
def test_print_alignment_aligns_each_hypothesis_token_to_a_source_token(lab, method):
    for sentence in lab.decode(method, *ALIGNMENT):
        for hypothesis in sentence.hypotheses:
            assert [target for _, target in hypothesis.alignment] == list(range(len(hypothesis.tokens)))
            assert all(0 <= source < len(sentence.source) for source, _ in hypothesis.alignment)


# ---------------------------------------------------------------- Monte Carlo dropout (test_inference_dropout)


@pytest.mark.parametrize("method", METHODS)
def test_retain_dropout_makes_decoding_vary_with_the_seed(lab, method):
    def scores(sentences: List[Sentence]) -> List[List[float]]:
        return [h.positional_scores for s in sentences for h in s.hypotheses]

    deterministic = scores(lab.decode(method, "--beam", "4"))
    first, second = (scores(lab.decode(method, *RETAINED_DROPOUT, "--beam", "4", seed=seed)) for seed in (1, 2))
    assert first != deterministic and first != second


def dropout_kept_at_inference(model, retained: Optional[List[str]]) -> set:
    """The dropout modules fairseq-generate's preparation keeps on (--retain-dropout), of a fresh copy."""
    model = copy.deepcopy(model)
    model.prepare_for_inference_(SimpleNamespace(generation=SimpleNamespace(
        beam=4, retain_dropout=True, retain_dropout_modules=retained)))
    return {name for name, m in model.named_modules() if isinstance(m, FairseqDropout) and m.apply_during_inference}


@pytest.mark.parametrize("retained", [["TransformerEncoder", "TransformerEncoderLayerBase"], ["MultiheadAttention"],
                                      ["TransformerDecoderLayerBase"], None], ids=["encoder", "attention", "decoder-layers", "all"])
@pytest.mark.parametrize("method", METHODS)
def test_retain_dropout_modules_keeps_the_dropouts_stock_keeps(lab, method, retained):
    """As fairseq's test_inference_dropout: the modules named by stock fairseq's class names keep
    their dropout at inference, the same modules as in stock's transformer (here of the same shape)."""
    kept = dropout_kept_at_inference(lab.model(method), retained)
    assert kept and kept == dropout_kept_at_inference(lab.model("stock"), retained)


# ---------------------------------------------------------------- fairseq-interactive, constraints, hub


@pytest.mark.parametrize("method", METHODS)
def test_fairseq_interactive_translates_as_fairseq_generate(lab, method):
    interactive = lab.interactive(method, lab.sources[:3], "--beam", "4")
    generated = lab.decode(method, *BEAM)[:3]
    assert [s.hypotheses[0].tokens for s in interactive] == [s.hypotheses[0].tokens for s in generated]


CONSTRAINTS = ("Jes@@ us", "God")  # a two-token phrase and a word, as BPE tokens of the target dictionary


def contains_in_order(tokens: Sequence[str], phrases: Sequence[str]) -> bool:
    text = " " + " ".join(tokens) + " "
    start = 0
    for phrase in phrases:
        found = text.find(" " + phrase + " ", start)
        if found < 0:
            return False
        start = found + len(phrase) + 1
    return True


@pytest.mark.parametrize("mode", ["ordered", "unordered"])
@pytest.mark.parametrize("method", METHODS)
def test_lexically_constrained_decoding_puts_the_constraints_in_every_hypothesis(lab, method, mode):
    lines = [f"{source}\t" + "\t".join(CONSTRAINTS) for source in lab.sources[:3]]
    for sentence in lab.interactive(method, lines, "--constraints", mode, "--beam", "4", "--nbest", "2"):
        # constrained beam search may finish fewer hypotheses than --nbest (stock's does here)
        assert 1 <= len(sentence.hypotheses) <= 2
        for hypothesis in sentence.hypotheses:
            if mode == "ordered":
                assert contains_in_order(hypothesis.tokens, CONSTRAINTS), hypothesis.tokens
            else:
                assert all(contains_in_order(hypothesis.tokens, [phrase]) for phrase in CONSTRAINTS), hypothesis.tokens


@pytest.mark.parametrize("method", METHODS)
def test_hub_interface_translates_as_fairseq_generate(lab, method):
    model_class = TransformerModel if method == "stock" else SparseTransformerModel
    checkpoint = lab.checkpoint(method)
    hub = model_class.from_pretrained(str(checkpoint.parent), checkpoint_file=checkpoint.name,
                                      data_name_or_path=str(lab.data))
    translation = hub.translate(lab.sources[0], beam=4, max_len_a=0, max_len_b=12)
    assert translation.split() == lab.decode(method, *BEAM)[0].hypotheses[0].tokens


# ---------------------------------------------------------------- the plugin's softmax is stock's transformer


def test_the_stock_copy_is_stock_fairseqs_transformer_with_the_softmax_weights(lab):
    stock, ours = lab.model(STOCK_FROM_SOFTMAX), lab.model("softmax")
    assert type(stock) is TransformerModel and isinstance(ours, SparseTransformerModel)
    assert stock.state_dict().keys() == ours.state_dict().keys()
    assert all(torch.equal(stock.state_dict()[k], v) for k, v in ours.state_dict().items())


@pytest.mark.parametrize("decoding", [BEAM, SAMPLING_TOPK, PREFIX], ids=["beam", "sampling", "prefix"])
def test_softmax_and_stock_transformer_with_the_same_weights_decode_alike(lab, decoding):
    ours, stock = lab.decode("softmax", *decoding), lab.decode(STOCK_FROM_SOFTMAX, *decoding)
    for mine, theirs in zip(ours, stock):
        assert [h.tokens for h in mine.hypotheses] == [h.tokens for h in theirs.hypotheses]
        for a, b in zip(mine.hypotheses, theirs.hypotheses):
            assert a.positional_scores == pytest.approx(b.positional_scores, abs=ATOL)


def test_l0drop_model_decodes_from_a_compressed_memory(lab):
    """What makes the l0drop column L0Drop: the encoder pass of fairseq-generate's model prunes encodings
    of the decoded sentences and hands the decoder a compressed memory (key counts for a padding mask)."""
    model = lab.model("l0drop")
    dictionary = model.encoder.dictionary
    pruned = 0
    for sentence in lab.decode("l0drop", *BEAM):
        source = [dictionary.index(t) for t in sentence.source] + [dictionary.eos()]
        with torch.no_grad():
            counts = model.encoder(torch.tensor([source]), torch.tensor([len(source)]))["encoder_padding_mask"][0]
        assert counts.dtype == torch.long and counts.sum().item() == len(source), "not a compressed memory"
        pruned += counts[0, 0].item()  # slot 0 stands for the pruned encodings
    assert pruned > 0
