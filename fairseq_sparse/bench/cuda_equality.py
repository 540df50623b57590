#!/usr/bin/env python
"""CUDA vs CPU: do the same weights give the same outputs on both devices? Per attention function.

For every registered attention function (placed where its paper puts it, as in
``fairseq_sparse.bench.run``), both L0Drop variants and stock fairseq's Transformer (the ``fairseq``
row, with the softmax row's weights), one model is built on the CPU, copied to
``--device``, and both copies run the same teacher-forced batch in eval mode and float32, with
TF32 off both for torch's matmuls and for the kernels' products (which follow torch's setting:
``core/kernels/tiles.dot_precision``), and the same target decoded incrementally, one step at a
time, as ``fairseq-generate`` does (where a CUDA device takes the kernels of ``core/kernels/``, the
CPU the registered functions). ``--dtype bf16`` (or fp16) compares within the device instead: the
model in that precision with the device's kernels against the same weights through
``--attn-impl reference`` on the same device (the CPU's half-precision matmuls are not the
GPU's); the kernels compute scores in float32 where the reference rounds them to half, so small
differences there are expected, and top-k may keep other keys near ties. The table gives the max abs difference of the
logits both ways, the largest logit (for scale), the fraction of positions whose argmax token
agrees and the largest difference of the parameters' gradients (of the teacher-forced logits'
weighted sum) relative to the largest gradient. The script exits 1 if any row's logits differ by
more than ``--tolerance`` or its gradients by more than ``--gradient-tolerance``.
``--device-attn-impl flex`` runs the device's copy with ``--attn-impl flex`` (the patterns through
FlexAttention, forward and backward) against the CPU's own path.

    python -m fairseq_sparse.bench.cuda_equality                    # needs a CUDA device
    python -m fairseq_sparse.bench.cuda_equality --device cpu       # CPU against CPU: a smoke test of the script

Random tokens; a small model (transformer_sparse_mini by default).
"""

import argparse
import copy
import sys
import warnings
from typing import Dict, List

import torch

import fairseq_sparse  # noqa: F401
from fairseq_sparse.core.attention import ATTN_IMPLS, DEFAULT_K, attention_names
from fairseq_sparse.core.modules.sparse_multihead_attention import SparseMultiheadAttention
from fairseq_sparse.bench.common import (FAIRSEQ, L0DROP, stock_architectures, build, build_row, build_stock_reference,
                                         make_batch, random_sentences, row_sublayers, synthetic_dictionary)

L0DROP_EVERY_LAYER = "l0drop_every_layer"
# --dtype -> (the model's dtype, default logit tolerance, default relative gradient tolerance)
# (in half precision the logit tolerance is relative to the largest logit: bf16's step at 8-16 is 0.0625)
DTYPE_TOLERANCES = {"fp32": (1e-4, 1e-3), "bf16": (2e-2, 5e-2), "fp16": (2e-2, 5e-2)}
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask and attn_mask is deprecated")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", nargs="+", default=None,
                        help=f"rows (default: every registered function, {L0DROP}, {L0DROP_EVERY_LAYER} and {FAIRSEQ})")
    parser.add_argument("--arch", default="transformer_sparse_mini", choices=sorted(stock_architectures()))
    parser.add_argument("--device", default="cuda", help="the device compared with the CPU (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--src-len", type=int, default=24, help="max length of the random sentences (min is half)")
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--k", type=int, default=DEFAULT_K)
    parser.add_argument("--pruned", "--sparsity", type=float, default=0.45, help="fraction of source encodings the L0Drop rows prune")
    parser.add_argument("--dtype", choices=sorted(DTYPE_TOLERANCES), default="fp32",
                        help="fp32: the device against the CPU; bf16 / fp16: the device's kernels against the device's "
                             "reference path in that precision (default: %(default)s)")
    parser.add_argument("--tolerance", type=float,
                        help="largest max abs logit difference that passes (default: 1e-4 in fp32; in half precision 2e-2 "
                             "times the largest logit)")
    parser.add_argument("--gradient-tolerance", type=float,
                        help="largest max abs gradient difference, relative to the largest gradient, that passes "
                             "(default: 1e-3 in fp32, 5e-2 in half)")
    parser.add_argument("--device-attn-impl", choices=ATTN_IMPLS, default=ATTN_IMPLS[0],
                        help="--attn-impl of the device's copy (the CPU's: auto; default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args(argv)
    known = [FAIRSEQ, L0DROP, L0DROP_EVERY_LAYER] + attention_names()
    args.functions = args.functions or attention_names() + [L0DROP, L0DROP_EVERY_LAYER, FAIRSEQ]
    for name in args.functions:
        if name not in known:
            parser.error(f"unknown row {name!r}; valid choices: {', '.join(known)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device")
    default_logits, default_gradients = DTYPE_TOLERANCES[args.dtype]
    args.tolerance = default_logits if args.tolerance is None else args.tolerance
    args.gradient_tolerance = default_gradients if args.gradient_tolerance is None else args.gradient_tolerance
    return args


def cpu_model(row: str, args, dictionary, batch):
    """The row's model on the CPU (L0Drop gates set to prune ``--pruned`` of the batch)."""
    if row == FAIRSEQ:
        softmax, _ = build_row("softmax", args.arch, dictionary, args.seed, "cpu", args.k, batch, args.pruned)
        return build_stock_reference(args.arch, softmax, dictionary, args.seed, "cpu")
    if row == L0DROP_EVERY_LAYER:
        from fairseq_sparse.bench.common import prune_fraction

        model = build(args.arch, dictionary, args.seed, "cpu", l0drop=True, l0drop_every_layer=True)
        prune_fraction(model, batch, args.pruned, args.seed)
        return model
    return build_row(row, args.arch, dictionary, args.seed, "cpu", args.k, batch, args.pruned)[0]


def describe(row: str) -> str:
    if row == FAIRSEQ:
        return "stock fairseq, softmax's weights"
    if row == L0DROP_EVERY_LAYER:
        return "encoder+decoder+cross (softmax), L0Drop gates after every encoder layer"
    if row == L0DROP:
        return "encoder+decoder+cross (softmax), L0Drop gates"
    return "+".join(row_sublayers(row))


def decoded_logits(model, batch) -> torch.Tensor:
    """The logits of every target position, decoded one step at a time with the incremental state, (B, T, V)."""
    encoder_out = model.encoder(batch["src_tokens"], src_lengths=batch["src_lengths"])
    state: dict = {}
    tokens = batch["prev_output_tokens"]
    steps = [model.decoder(tokens[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0][:, -1]
             for t in range(tokens.size(1))]
    return torch.stack(steps, dim=1).float().cpu()


def gradients(model, batch) -> Dict[str, torch.Tensor]:
    """Gradients of every parameter of a fixed weighted sum of the teacher-forced logits (eval mode: no dropout)."""
    model.zero_grad(set_to_none=True)
    logits = model(**batch)[0].float()
    weights = torch.linspace(-1, 1, logits.size(-1), device=logits.device)
    (logits * weights).sum().backward()
    return {name: p.grad.float().cpu() for name, p in model.named_parameters() if p.grad is not None}


def with_impl(model, impl: str):
    for module in model.modules():
        if isinstance(module, SparseMultiheadAttention):
            module.impl = impl
    return model


def compare(row: str, args, dictionary, batch) -> Dict[str, float]:
    model = cpu_model(row, args, dictionary, batch).eval()
    other = with_impl(copy.deepcopy(model).to(args.device).eval(), args.device_attn_impl)
    moved = {k: v.to(args.device) for k, v in batch.items()}
    if args.dtype != "fp32":  # within the device: its reference path in the same precision
        dtype = TORCH_DTYPES[args.dtype]
        model = with_impl(copy.deepcopy(model).to(args.device, dtype).eval(), "reference")
        other = other.to(dtype)
        batch = moved
    with torch.no_grad():
        logits = model(**batch)[0].float()
        logits_other = other(**moved)[0].float().cpu()
        decoded, decoded_other = decoded_logits(model, batch), decoded_logits(other, moved)
    grads, grads_other = gradients(model, batch), gradients(other, moved)
    scale = max(g.abs().max().item() for g in grads.values())
    grad_diff = float("inf")  # a parameter with a gradient on one device only
    if set(grads) == set(grads_other):
        grad_diff = max((grads[name] - grads_other[name]).abs().max().item() for name in grads) / max(scale, 1e-12)
    real = batch["prev_output_tokens"].ne(dictionary.pad())
    agree = (logits.argmax(-1) == logits_other.argmax(-1))[real].float().mean().item()
    return {"diff": (logits - logits_other).abs().max().item(), "scale": logits.abs().max().item(), "agree": agree,
            "decode_diff": (decoded - decoded_other)[real].abs().max().item(), "grad_diff": grad_diff}


def main(argv: List[str] = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dictionary = synthetic_dictionary(args.vocab)
    sources = random_sentences(dictionary, args.batch_size, args.src_len, args.seed)
    batch, _ = make_batch(sources, sources, dictionary, "cpu")
    device_name = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else args.device
    compared = (f"CPU vs {args.device} ({device_name}): {args.arch}, float32 (TF32 off for torch's matmuls and the "
                f"kernels' products alike)" if args.dtype == "fp32" else
                f"{args.device} ({device_name}) --attn-impl {args.device_attn_impl} vs the same device's --attn-impl "
                f"reference: {args.arch}, {args.dtype}")
    print(f"{compared}, eval mode, batch {args.batch_size} "
          f"random sentences of {max(2, args.src_len // 2)}-{args.src_len} tokens, teacher forcing and incremental decoding, "
          f"the device's --attn-impl {args.device_attn_impl}; pass: max |Δ logits| ≤ {args.tolerance:g}"
          f"{'' if args.dtype == 'fp32' else ' x max(1, max |logit|)'} and "
          f"max |Δ gradient| / max |gradient| ≤ {args.gradient_tolerance:g}\n")
    print("| row | sublayers | max abs Δ logits | max abs Δ logits, decoding | max abs logit | argmax agreement "
          "| max abs Δ gradients (relative) | result |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    failed = []
    for row in dict.fromkeys(args.functions):
        try:
            r = compare(row, args, dictionary, batch)
        except Exception as err:  # one row's failure must not hide the others
            failed.append(row)
            print(f"| {row} | {describe(row)} | - | - | - | - | - | ERROR {type(err).__name__}: {str(err)[:200]} |", flush=True)
            continue
        allowed = args.tolerance * (max(1.0, r["scale"]) if args.dtype != "fp32" else 1.0)
        ok = max(r["diff"], r["decode_diff"]) <= allowed and r["grad_diff"] <= args.gradient_tolerance
        if not ok:
            failed.append(row)
        print(f"| {row} | {describe(row)} | {r['diff']:.2e} | {r['decode_diff']:.2e} | {r['scale']:.2f} | {r['agree']:.1%} | "
              f"{r['grad_diff']:.2e} | {'ok' if ok else 'DIFFERENT'} |", flush=True)
    print(f"\n{len(failed)} of {len(args.functions)} rows differ or failed" + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
