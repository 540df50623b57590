# Sentence-level top-k (k = 8, every sublayer)'s attention mass on the 4 nearest keys (the keys Top-k (OOW) would take
# as its window) and beyond them, self-attention, on the validation verses (Mark), per layer; the counterpart of
# study_documents_oow_mass.csv at sentence length. Initialisation: one update at lr 1e-9 of study_de_en's topk
# training command (fairseq-train writes no checkpoint before its first update), seeds 1 and 2.
# DATA: runs/data/paper/bible_de_en_full/bin (python -m fairseq_sparse.tables study_de_en --profile paper --dry-run
# prints its preparation); TRAIN: study_de_en's topk training command (same --dry-run). Written 2026-12-05.
# If top-k chose its 8 keys at random and weighted them equally, the 4 nearest would hold 4/n of a query's mass
# (n visible keys): 0.134 in the encoder and 0.285 in the decoder on these verses, averaged as the tool averages.
$TRAIN --seed 1 --lr 1e-9 --max-update 1 --no-epoch-checkpoints --disable-validation --save-dir init1  # in place of --seed 1 --lr 0.002 --max-epoch 30 --patience 2 --keep-last-epochs 5 and the table's --save-dir
python -m fairseq_sparse.analysis.oow_mass $DATA --path init1/checkpoint_last.pt --split valid --label init-seed1 --out results/study/study_de_en_topk_mass.csv
$TRAIN --seed 2 --lr 1e-9 --max-update 1 --no-epoch-checkpoints --disable-validation --save-dir init2
python -m fairseq_sparse.analysis.oow_mass $DATA --path init2/checkpoint_last.pt --split valid --label init-seed2 --out results/study/study_de_en_topk_mass.csv
# After training: study_diagnosis' topk_lr14 (10 epochs at the papers' 1.4e-3 after 1,000 warm-up, seed 1; the runner's model,
# epochs 6-10 averaged as its table decodes; M: its run folder under runs/models/paper/bible_de_en_full/):
python -m fairseq_sparse.analysis.oow_mass $DATA --path M/checkpoint_avg.pt --split valid --label trained-topk_lr14-seed1 --out results/study/study_de_en_topk_mass.csv
