#!/usr/bin/env bash
# The CPU-scale study: each paper's central comparison on the full offline Bible corpus, models trained
# until the validation loss stops improving (configs/papers/study.yaml), >= 2 seeds. Days of one 2-core
# CPU in all; every finished step is kept, so run it again to go on where it stopped, and
# `bash scripts/study.sh --report-only` writes the tables from what has finished so far.
# Order: the core rows on De-En (both seeds), the sweeps on De-En, the core rows on Fr-En.
#
#   bash scripts/study.sh                # train, decode, analyse; tables under runs/tables/study_*/paper
#   bash scripts/study.sh --report-only  # tables (Markdown, CSV, PNG) from the finished steps
#   TABLES="study_de_en" bash scripts/study.sh   # one table only
#   JOBS=1 bash scripts/study.sh         # one training at a time (default 2: two trainings side by side,
#                                        # the cores split between them; decodes still run alone)
# Each table's Markdown, CSV and plots are copied to results/study/ (committed; runs/ is not).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
# results/study/ keeps each table's Markdown, CSV and plots for the repository (runs/ is not committed)
mkdir -p results/study
for table in ${TABLES:-study_de_en study_sweeps study_fr_en}; do
    .venv/bin/python -m fairseq_sparse.tables "$table" --profile paper --jobs "${JOBS:-2}" "$@" || status=$?
    out=runs/tables/$table/paper
    if [ -f "$out/$table.md" ]; then
        cp "$out/$table.md" "$out/$table.csv" results/study/
        [ -f "$out/commands.sh" ] && cp "$out/commands.sh" "results/study/$table.commands.sh"
        [ -f "$out/$table.png" ] && cp "$out/$table.png" results/study/
        [ -f "$out/$table.curves.png" ] && cp "$out/$table.curves.png" "$out/$table.curves.csv" results/study/
        [ -d "$out/heatmap" ] && mkdir -p "results/study/heatmap" && cp "$out"/heatmap/*.png results/study/heatmap/ 2>/dev/null || true
    fi
done
exit ${status:-0}
