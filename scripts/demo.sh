#!/usr/bin/env bash
# CPU demo on real bitext: German->English Bible verses (offline corpus, see data-prep/bible.py).
# Trains a small transformer_sparse per attention function for a fixed number of updates,
# decodes the held-out Gospel of John with beam 4 and prints detokenised sacreBLEU (with its
# signature) for each.
#
#   bash scripts/demo.sh                                   # softmax and top-k (k=8)
#   DEMO_FUNCTIONS="softmax topk hard rela_g" MAX_UPDATE=1200 bash scripts/demo.sh
#
# Everything is written under $OUT (default runs/demo); data are reused between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh

OUT=${OUT:-runs/demo}
FUNCTIONS=${DEMO_FUNCTIONS:-"softmax topk"}
MAX_UPDATE=${MAX_UPDATE:-500}
TRAIN_PAIRS=${TRAIN_PAIRS:-12000}
TEST_PAIRS=${TEST_PAIRS:-300}
BIN=.venv/bin
DATA=$OUT/data

if [ ! -f "$DATA/bin/dict.en.txt" ]; then
    $BIN/python data-prep/bible.py --pair de-en --out "$DATA" --max-train-pairs "$TRAIN_PAIRS" \
        --max-eval-pairs "$TEST_PAIRS" --bpe-merges 3000 --binarize
fi

declare -A RESULT
for fn in $FUNCTIONS; do
    save=$OUT/checkpoints/$fn
    echo "=== $fn: training $MAX_UPDATE updates"
    start=$(date +%s)
    # The decoder self-attention of hard retrieval uses the paper's placement (decoder self + cross);
    # every other function runs in all three sublayers.
    enc_fn=$fn; [ "$fn" = hard ] && enc_fn=softmax
    $BIN/fairseq-train "$DATA/bin" --user-dir fairseq_sparse --arch transformer_sparse_mini \
        --encoder-embed-dim 128 --decoder-embed-dim 128 --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 \
        --encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings \
        --encoder-attn-fn "$enc_fn" --decoder-attn-fn "$fn" --cross-attn-fn "$fn" --attn-k 8 \
        --optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.002 --lr-scheduler inverse_sqrt --warmup-updates 200 \
        --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --dropout 0.1 \
        --max-tokens 4096 --max-update "$MAX_UPDATE" --save-dir "$save" --no-epoch-checkpoints \
        --cpu --seed 1 --log-format simple --log-interval 50 --disable-validation > "$OUT/train.$fn.log" 2>&1 \
        || { tail -20 "$OUT/train.$fn.log"; exit 1; }
    grep -E "train_inner" "$OUT/train.$fn.log" | tail -2
    trained=$(( $(date +%s) - start ))
    echo "=== $fn: decoding $TEST_PAIRS held-out verses (beam 4)"
    start=$(date +%s)
    $BIN/fairseq-generate "$DATA/bin" --user-dir fairseq_sparse --path "$save/checkpoint_last.pt" \
        --beam 4 --lenpen 1.0 --batch-size 64 --required-batch-size-multiple 1 --cpu --post-process subword_nmt \
        > "$OUT/generate.$fn.log" 2>&1 \
        || { tail -20 "$OUT/generate.$fn.log"; exit 1; }
    decoded=$(( $(date +%s) - start ))
    $BIN/python -m fairseq_sparse.evaluate "$OUT/generate.$fn.log" "$DATA/test.raw.en" --lang en \
        --hypotheses-out "$OUT/hyp.$fn.en" | tee "$OUT/bleu.$fn.txt"
    RESULT[$fn]="$(head -1 "$OUT/bleu.$fn.txt" | cut -d' ' -f3) | ${trained}s | ${decoded}s"
done

echo
echo "| attention | BLEU | train time | decode time |"
echo "|---|---:|---:|---:|"
for fn in $FUNCTIONS; do echo "| $fn | ${RESULT[$fn]} |"; done
echo
tail -1 "$OUT/bleu.$(echo $FUNCTIONS | cut -d' ' -f1).txt"
echo "Outputs in $OUT (logs, checkpoints, hypotheses)."
