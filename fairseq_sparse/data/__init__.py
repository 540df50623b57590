"""Data preparation: one module per dataset family, each runnable as ``python -m fairseq_sparse.data.NAME``.

``bible`` (the offline Bible corpus), ``iwslt14_de_en``, ``iwslt15_en_vi``, ``iwslt17_fr_en``, ``wmt``
(WMT14/16/17/18 sentence level), ``documents`` (document-level corpora), ``document_blocks`` (packing
documents into blocks); ``common`` holds what they share (raw files, Moses, BPE, binarisation).
"""
