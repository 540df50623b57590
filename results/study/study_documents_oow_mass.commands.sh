# Top-k (OOW)'s attention mass on its window and on its picks, study_documents' topk_oow model at initialisation
# (one update at lr 1e-9: fairseq-train writes no checkpoint before its first update), seeds 1 and 2, on the
# validation blocks (Mark). DATA: the table's bible_doc_de_en/bin (python -m fairseq_sparse.tables study_documents
# --profile paper --dry-run prints its preparation); TRAIN: the table's topk_oow training command (same --dry-run).
# Written 2026-12-05.
$TRAIN --seed 1 --lr 1e-9 --max-update 1 --no-epoch-checkpoints --disable-validation --save-dir init1  # in place of --seed 1 --lr 0.002 --max-epoch 10 --keep-last-epochs 5 and the table's --save-dir
python -m fairseq_sparse.analysis.oow_mass $DATA --path init1/checkpoint_last.pt --split valid --label init-seed1 --out results/study/study_documents_oow_mass.csv
$TRAIN --seed 2 --lr 1e-9 --max-update 1 --no-epoch-checkpoints --disable-validation --save-dir init2  # in place of --seed 1 --lr 0.002 --max-epoch 10 --keep-last-epochs 5 and the table's --save-dir
python -m fairseq_sparse.analysis.oow_mass $DATA --path init2/checkpoint_last.pt --split valid --label init-seed2 --out results/study/study_documents_oow_mass.csv
# k = 16 (topk_oow_k16's window of 8 and 8 picks), seed 1:
$TRAIN --seed 1 --lr 1e-9 --max-update 1 --no-epoch-checkpoints --disable-validation --save-dir initk16 --encoder-attn-k 16 --decoder-attn-k 16
python -m fairseq_sparse.analysis.oow_mass $DATA --path initk16/checkpoint_last.pt --split valid --label init-k16-seed1 --out results/study/study_documents_oow_mass.csv
# After training (2026-12-05, second sitting): study_documents' topk_oow seed 1 trained again with the table's own
# training command (TRAIN, --seed 1 as in the table, pinned to one core: taskset -c 1, OMP_NUM_THREADS=1, tcmalloc), kept
# in W, its last 5 epoch checkpoints averaged as the table does; validation curve in study_documents_oow_retrain.curves.csv
# (epoch 10: 6.276, where the record's seed-1 run had 6.245). Shares on the averaged model:
$TRAIN --seed 1 --save-dir W/checkpoints   # exactly the table's command but the folder
python -m fairseq_sparse.average_checkpoints W/checkpoints --last 5 --by epoch --output W/checkpoint_avg.pt
python -m fairseq_sparse.analysis.oow_mass $DATA --path W/checkpoint_avg.pt --split valid --label trained-seed1 --out results/study/study_documents_oow_mass.csv
# The same model decoded (the table's decode) and validated, as trained and with its picks removed (a window of
# k/2 = 4, Top-k (OOW)'s own window): study_documents_oow_decodes.csv. d-BLEU as the table scores it:
OVERRIDE="{'encoder_attn_fn': 'window', 'decoder_attn_fn': 'window', 'encoder_attn_k': 4, 'decoder_attn_k': 4}"
fairseq-generate $DATA --user-dir fairseq_sparse --path W/checkpoint_avg.pt --gen-subset test --beam 4 --lenpen 1.0 --batch-size 16 --max-len-a 1.2 --max-len-b 10 --required-batch-size-multiple 1 --post-process subword_nmt > W/test.gen
fairseq-generate $DATA ...the same... --model-overrides "$OVERRIDE" > W/test_nopicks.gen
python -m fairseq_sparse.evaluate W/test.gen DATA_DIR/test.raw.en --lang en --documents DATA_DIR/test.blocks.tsv   # DATA_DIR: $DATA/..
python -m fairseq_sparse.evaluate W/test_nopicks.gen DATA_DIR/test.raw.en --lang en --documents DATA_DIR/test.blocks.tsv
fairseq-validate $DATA --task translation --user-dir fairseq_sparse --path W/checkpoint_avg.pt --valid-subset valid --max-tokens 4096 --num-workers 0 [--model-overrides "$OVERRIDE"]
fairseq-validate $DATA --task translation --user-dir fairseq_sparse --path W/checkpoints/checkpoint10.pt --valid-subset valid --max-tokens 4096 --num-workers 0 [--model-overrides "$OVERRIDE"]
# The remedy row's model (python -m fairseq_sparse.tables study_documents --profile paper --record results/study --rows
# topk_oow_after_w4; R: its run folder under runs/models/paper/bible_doc_de_en/): shares, and the same decodes and
# validations as above with R/checkpoint_avg.pt (labels after-w4-avg, after-w4-avg-nopicks of study_documents_oow_decodes.csv).
python -m fairseq_sparse.analysis.oow_mass $DATA --path R/checkpoint_avg.pt --split valid --label after-w4-seed1 --out results/study/study_documents_oow_mass.csv
# topk_oow_k16 after training (2026-12-05, third sitting; python -m fairseq_sparse.tables study_documents --profile paper
# --record results/study --rows topk_oow_k16 --seeds 1; K: its run folder under runs/models/paper/bible_doc_de_en/):
python -m fairseq_sparse.analysis.oow_mass $DATA --path K/checkpoint_avg.pt --split valid --label trained-k16-seed1 --out results/study/study_documents_oow_mass.csv
# topk_oow_w8 after training (the same sitting; --rows topk_oow_w8 --seeds 1; K8: its run folder). Its rows were
# first written to a CSV of their own and moved here when every row gained the window column (the window of
# the rows before it: ceil(k/2), the size the tool measured):
python -m fairseq_sparse.analysis.oow_mass $DATA --path K8/checkpoint_avg.pt --split valid --label trained-w8-seed1 --out results/study/study_documents_oow_mass.csv
