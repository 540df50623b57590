import sys

from fairseq_sparse.experiments.cli import main

sys.exit(main())
