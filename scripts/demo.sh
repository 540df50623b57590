#!/usr/bin/env bash
# CPU demo on real bitext: German->English Bible verses (offline corpus, fairseq_sparse.data.bible).
# Trains one small softmax model, then applies the papers' recipes to it: decoding it with top-k,
# hard retrieval and 1.5-entmax, fine-tuning it with hard retrieval and with L0Drop gates; decodes
# the held-out Gospel of John and prints one table: sacreBLEU (with its signature), attention
# sparsity, encoder outputs pruned and decoding speed relative to softmax; saves cross-attention
# heatmaps of softmax vs top-k (PNG). About 11 minutes on 2 CPU cores; progress is printed as it goes.
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
.venv/bin/python -m fairseq_sparse.tables demo --profile paper "$@"
echo "demo finished in $(( $(date +%s) - start ))s"
