"""Data preparation: one module per dataset family, each runnable as ``python -m fairseq_sparse.data.NAME``.

The commands: ``bible`` (the offline Bible corpus), ``iwslt14_de_en``, ``iwslt15_en_vi``,
``iwslt17_fr_en``, ``wmt`` (WMT14/16/17/18 sentence level), ``documents`` (document-level corpora),
``document_blocks`` (packing documents into blocks), ``pos_prune_table`` (L0Drop's POS pruning table).

The steps they share, one module each: ``raw`` (reading the raw formats, strict decoding),
``download``, ``moses`` (normalisation, tokenisation, truecasing, detokenisation), ``subwords``
(BPE, sentencepiece, characters), ``filtering`` (length filter), ``binarise``
(``fairseq-preprocess``), ``text`` (the intermediate files), ``errors``.  The sentence-level
scripts describe their dataset as a ``job`` that ``pipeline`` runs, behind the options and
``main`` of ``cli``; ``bible_db``, ``bible_cleaning``, ``bible_corpus`` and
``document_readers``, ``document_corpora`` hold the rest of ``bible`` and ``documents``.
"""

if "." not in __name__:  # fairseq imported this folder as a --user-dir, by its own name
    from fairseq_sparse.core.errors import refuse_folder_as_user_dir

    refuse_folder_as_user_dir(__file__)
