"""fairseq-sparse: sparse attention methods for fairseq NMT, as a --user-dir plugin.

The fairseq fork (ve-fairseq 0.12.3, which imports on Python 3.11 and 3.12) is not listed
in install_requires: its metadata requires torchaudio, and every torchaudio release pins
one torch, which pip would install over the user's. scripts/setup-env.sh installs it with
--no-deps; the packages it really needs at run time are listed below.
"""

from pathlib import Path

from setuptools import find_packages, setup

FAIRSEQ_FORK = "ve-fairseq==0.12.3"


# Compatible ranges, so that installing the plugin into an environment that already has a
# CUDA build of torch (2.11 on the GPU machines we borrow, with Python 3.12) keeps it; the
# exact versions tested are pinned in requirements.txt, which scripts/setup-env.sh installs.
# torch >= 2.1: scaled_dot_product_attention's `scale` argument.
INSTALL_REQUIRES = [
    "torch>=2.1",
    "numpy>=1.24,<2.5",
    "hydra-core>=1.3,<1.4",
    "omegaconf>=2.3,<2.4",
    "cffi>=1.15",
    "regex>=2022.1.18",
    "tqdm>=4.60",
    "bitarray>=2.0",
    "scikit-learn>=1.2",
    "packaging>=23.0",
    "entmax>=1.3,<2",
    "sacrebleu>=2.3,<3",
    "sacremoses>=0.1",
    "sentencepiece>=0.1.99",
    "subword-nmt>=0.3.8",
    "matplotlib>=3.7",
    "hanta>=1.2",
    # fairseq-train --tensorboard-logdir; without it fairseq also prints "Please install tensorboardX" on import
    "tensorboardX>=2.5",
    # the table runner's Slurm launcher (python -m fairseq_sparse.tables ... --launcher slurm)
    "submitit>=1.5,<2",
]


setup(
    name="fairseq-sparse",
    version="0.1.0",
    description="Sparse attention (top-k, hard retrieval, ReLA, L0Drop, entmax) for fairseq NMT",
    long_description=Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9,<3.13",
    packages=find_packages(include=["fairseq_sparse", "fairseq_sparse.*"]),
    # the table configurations run from an installed package (python -m fairseq_sparse.tables NAME)
    package_data={"fairseq_sparse": ["configs/*.yaml", "configs/*/*.yaml", "configs/README.md"]},
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": ["pytest==9.2.0", "pytest-xdist==3.8.0"]},
    classifiers=["Programming Language :: Python :: 3.11", "Programming Language :: Python :: 3.12", "Topic :: Scientific/Engineering :: Artificial Intelligence"],
)
