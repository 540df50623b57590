"""Architectures of the Extremely Sparse Transformer paper's translation experiments (section 5.1).

Sizes only fix defaults: every option given on the command line wins, so one preset serves
the paper's whole grid of method x k, e.g. ``--encoder-attn-fn window --decoder-attn-fn
window --attn-k 16``. Pass ``--share-all-embeddings`` as both papers' commands do (a
boolean flag cannot be defaulted on by an architecture).
"""

from .sparse_transformer import _preset, sparse_base_architecture

# Bao et al. (2021) pack documents into blocks of 512 tokens; positions cover twice that.
DOCUMENT_MAX_POSITIONS = 1024


def document_sizes(args) -> None:
    """Bao et al. (2021)'s document-level Transformer: base sizes (6+6, 512/2048, 8 heads), dropout 0.3."""
    args.dropout = getattr(args, "dropout", 0.3)
    args.max_source_positions = getattr(args, "max_source_positions", DOCUMENT_MAX_POSITIONS)
    args.max_target_positions = getattr(args, "max_target_positions", DOCUMENT_MAX_POSITIONS)
    sparse_base_architecture(args)


def fr_en_mini_sizes(args) -> None:
    """Wang et al. (2020)'s mini model used for IWSLT17 Fr-En: 2+2 layers, base widths, dropout 0.3."""
    args.encoder_layers = getattr(args, "encoder_layers", 2)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    args.dropout = getattr(args, "dropout", 0.3)
    sparse_base_architecture(args)


_preset("transformer_sparse_doc", document_sizes,
        "Document-level model (Table 2): blocks of 512 tokens, Bao et al.'s base Transformer; attention as given.")
_preset("transformer_topk_oow_doc", document_sizes,
        "Top-k (OOW) in encoder and decoder self-attention, k=8 (Table 2's best), softmax cross-attention.",
        encoder_attn_fn="topk_oow", decoder_attn_fn="topk_oow", attn_k=8)
_preset("transformer_topk_fr_en_mini", fr_en_mini_sizes,
        "Sentence-level Fr-En mini model (Table 1): top-k in every sublayer, k=8.",
        encoder_attn_fn="topk", decoder_attn_fn="topk", cross_attn_fn="topk", attn_k=8)
