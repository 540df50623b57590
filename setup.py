"""fairseq-sparse: sparse attention methods for fairseq NMT, as a --user-dir plugin.

The fairseq fork (ve-fairseq 0.12.3, which imports on Python 3.11) is not listed in
install_requires: its metadata requires torchaudio, and every torchaudio release pins
a torch other than 2.13.0. scripts/setup-env.sh installs it with --no-deps; the
packages it really needs at run time are listed below.
"""

from pathlib import Path

from setuptools import find_packages, setup

FAIRSEQ_FORK = "ve-fairseq==0.12.3"


def requirements():
    lines = Path(__file__).with_name("requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#") and not line.startswith("pytest")]


setup(
    name="fairseq-sparse",
    version="0.1.0",
    description="Sparse attention (top-k, hard retrieval, ReLA, L0Drop, entmax) for fairseq NMT",
    long_description=Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9,<3.12",
    packages=find_packages(include=["fairseq_sparse", "fairseq_sparse.*"]),
    install_requires=requirements(),
    extras_require={"test": ["pytest==9.2.0"]},
    classifiers=["Programming Language :: Python :: 3.11", "Topic :: Scientific/Engineering :: Artificial Intelligence"],
)
