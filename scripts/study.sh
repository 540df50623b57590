#!/usr/bin/env bash
# The CPU-scale study: each paper's central comparison on the full offline Bible corpus, models trained
# until the validation loss stops improving (configs/papers/study.yaml), >= 2 seeds. Days of one 2-core
# CPU in all; every finished step is kept, so run it again to go on where it stopped, and
# `bash scripts/study.sh --report-only` writes the tables from what has finished so far.
# Order: the diagnosis of the disagreements (study_diagnosis: one change at a time, 10 epochs), the core rows
# on De-En with the papers' recipe (study_de_en_faithful), the disagreeing rows at two sizes for a fixed 8
# epochs (study_small_early, study_scale_early), on half the data for as many updates (study_data_early)
# and at the larger size to convergence (study_scale),
# the core rows with the first recipe (study_de_en: finished, kept), the sweeps on De-En, the core rows on Fr-En.
#
#   bash scripts/study.sh                # train, decode, analyse; tables under runs/tables/study_*/paper
#   bash scripts/study.sh --report-only  # tables (Markdown, CSV, PNG) from the finished steps
#   TABLES="study_de_en" bash scripts/study.sh   # one table only
#   TABLES="study_de_en" bash scripts/study.sh --rows softmax l0drop   # these rows only, with the models
#                                        # they need (what fits in one sitting: ~2 h a model alone);
#                                        # of several tables, each one's rows among those named
#   MALLOC=system bash scripts/study.sh  # glibc's malloc even where tcmalloc is installed (see below)
#   JOBS=1 bash scripts/study.sh         # one command at a time (default 2: two side by side, the cores
#                                        # split between them; a decode timed for a speed column runs alone)
# Every finished cell (each seed's value, with the identity of the commands that measured it) is kept in
# results/study/NAME.seeds.csv, and each table's Markdown, CSV and plots are copied to results/study/ after
# every finished step (committed; runs/ is not). A sitting on a machine without the last one's runs/
# reads the finished seeds from there and runs only the cells still missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
# tcmalloc where it is installed (Debian: apt-get install libtcmalloc-minimal4): glibc's malloc hands the
# large per-batch tensors back to the kernel and faults them in again, a quarter of the CPU time in
# the kernel; tcmalloc made 1.54x the updates a second with the same losses on 2 cores
# (COMPARE=tcmalloc bash scripts/study-throughput.sh). MALLOC=system keeps glibc's.
TCMALLOC=$(ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 2>/dev/null | head -1 || true)
if [ -n "$TCMALLOC" ] && [ "${MALLOC:-tcmalloc}" = tcmalloc ]; then
    export LD_PRELOAD="$TCMALLOC${LD_PRELOAD:+:$LD_PRELOAD}"
    echo "study.sh: commands run with tcmalloc ($TCMALLOC; MALLOC=system to keep glibc's malloc)"
fi
# one queue: the next table's trainings start beside the last ones of the table before
# shellcheck disable=SC2086  # TABLES is a list of names
exec .venv/bin/python -m fairseq_sparse.tables ${TABLES:-study_diagnosis study_de_en_faithful study_small_early study_scale_early study_data_early study_scale study_de_en study_sweeps study_fr_en} \
    --profile paper --jobs "${JOBS:-2}" --record results/study "$@"
