#!/usr/bin/env bash
# CPU demo on real bitext: German->English Bible verses (offline corpus, data-prep/bible.py).
# Trains small models with softmax, top-k, hard retrieval, ReLA-g and 1.5-entmax attention for a
# fixed budget, fine-tunes the softmax model with L0Drop, decodes the held-out Gospel of John and
# prints one table: sacreBLEU (with its signature), attention sparsity, encoder outputs pruned and
# decoding speed relative to softmax; saves cross-attention heatmaps of softmax vs top-k (PNG).
# About 15 minutes on 2 CPU cores; progress is printed as it goes.
#
#   bash scripts/demo.sh                 # everything under runs/tables/demo/paper and runs/models
#   bash scripts/demo.sh --profile smoke # a tiny version in about two minutes
#
# The table and its settings are configs/tables/demo.yaml and configs/papers/demo.yaml; finished
# steps are skipped when the demo is run again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
start=$(date +%s)
.venv/bin/python -m fairseq_sparse.tables configs/tables/demo.yaml --profile paper "$@"
echo "demo finished in $(( $(date +%s) - start ))s"
