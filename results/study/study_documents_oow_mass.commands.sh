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
