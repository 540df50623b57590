if "." not in __name__:  # fairseq imported this folder as a --user-dir, by its own name
    from fairseq_sparse.core.errors import refuse_folder_as_user_dir

    refuse_folder_as_user_dir(__file__)
