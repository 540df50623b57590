"""Report the share of encoder outputs an L0Drop checkpoint prunes on a binarised split.

    python -m fairseq_sparse.l0drop_pruned DATA_BIN --path checkpoints/checkpoint_best.pt [--split test]

Pruned share = pruned source encodings (g_hat = 0, or pruned by a rule pattern) / source tokens,
over the whole split: what the L0Drop paper calls the sparsity rate. ("Zero weights" is the
other sparsity, of attention weights: ``python -m fairseq_sparse.analysis``.)
"""

import argparse
import sys
from pathlib import Path

import torch
from fairseq import checkpoint_utils, progress_bar, utils

import fairseq_sparse  # noqa: F401  (registers the model)


def pruned_share(model, task, split: str, max_tokens: int, cpu: bool) -> dict:
    task.load_dataset(split)
    dataset = task.dataset(split)
    iterator = task.get_batch_iterator(dataset=dataset, max_tokens=max_tokens, max_positions=utils.resolve_max_positions(
        task.max_positions(), model.max_positions())).next_epoch_itr(shuffle=False)
    closed = real = sentences = 0
    model.eval()
    for sample in progress_bar.progress_bar(iterator, log_format="tqdm", prefix=f"pruned on {split}"):
        sample = sample if cpu else utils.move_to_cuda(sample)
        net_input = sample["net_input"]
        with torch.no_grad():
            encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
        closed += int(encoder_out["l0drop_closed"][0].sum())
        real += int(net_input["src_tokens"].ne(task.source_dictionary.pad()).sum())
        sentences += len(net_input["src_tokens"])
    return {"split": split, "sentences": sentences, "source_tokens": real, "pruned": closed, "pruned_share": closed / max(real, 1)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="binarised data directory")
    parser.add_argument("--path", required=True, help="checkpoint of a transformer_sparse model with --l0drop or a prune pattern")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU even if a GPU is available")
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if not Path(args.path).is_file():
        sys.exit(f"l0drop_pruned: error: no such checkpoint: {args.path}")
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([args.path], arg_overrides={"data": args.data})
    model = models[0]
    cpu = args.cpu or not torch.cuda.is_available()
    if not cpu:
        model.cuda()
    if not hasattr(model.encoder, "l0drop_gate"):
        sys.exit(f"l0drop_pruned: error: {args.path} has no L0Drop gates or prune pattern (trained without --l0drop)")
    result = pruned_share(model, task, args.split, args.max_tokens, cpu)
    print(f"{result['split']}: {result['pruned']} of {result['source_tokens']} source encodings pruned "
          f"({result['sentences']} sentences): {result['pruned_share']:.2%} pruned")
    return result


if __name__ == "__main__":
    main()
