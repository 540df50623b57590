"""The command line the raw-data scripts share: their common options and their ``main``.

A script (``iwslt14_de_en``, ``iwslt15_en_vi``, ``iwslt17_fr_en``, ``wmt``) gives ``main_with`` a
parser made by ``base_parser`` plus its own options, a function from the options to its ``Job``
and one to its download URLs; ``documents`` shares the options and the error reporting.  Every
``PrepError`` ends the command with one line ``error: ...`` and exit status 1, no traceback.
"""

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from fairseq_sparse.data.download import download
from fairseq_sparse.files import describe_os_error
from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.job import Job
from fairseq_sparse.data.pipeline import run
from fairseq_sparse.data.raw import check_encoding


def add_common_args(p: argparse.ArgumentParser, download_help: str, default_out: Optional[str] = None,
                    no_binarize: bool = True) -> None:
    """Where the raw files are (``--raw DIR``, or ``--download`` into ``--raw-dir``), ``--out``
    (required without ``default_out``), ``--workers``, ``--no-binarize``, ``--keep-tmp``, ``--encoding``."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--raw", metavar="DIR",
                     help="directory holding the already-downloaded and extracted raw "
                          "files (searched recursively by file name)")
    src.add_argument("--download", action="store_true", help=download_help)
    p.add_argument("--raw-dir", metavar="DIR",
                   help="with --download: where to put the downloaded files (default OUT/raw)")
    if default_out is None:
        p.add_argument("--out", required=True, help="output directory")
    else:
        p.add_argument("--out", default=default_out, help=f"output directory (default {default_out})")
    p.add_argument("--workers", type=int, default=1,
                   help="processes for tokenisation and fairseq-preprocess (default 1)")
    if no_binarize:
        p.add_argument("--no-binarize", action="store_true",
                       help="stop after writing the text files (skip fairseq-preprocess)")
    p.add_argument("--keep-tmp", action="store_true",
                   help="keep the intermediate files in OUT/tmp")
    p.add_argument("--encoding", default="utf-8",
                   help="text encoding of the raw files (default %(default)s); a byte that does not decode "
                        "stops preparation with its file and line, it is never replaced")


def base_parser(description: str, default_out: str) -> argparse.ArgumentParser:
    """The parser of a sentence-level script, with the common options."""
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, "download the official archives into OUT/raw (or --raw-dir) "
                       "and extract them first", default_out)
    return p


def add_filter_args(p: argparse.ArgumentParser, max_len: int, ratio: float) -> None:
    p.add_argument("--max-len", type=int, default=max_len,
                   help=f"drop training pairs with a side longer than this (default "
                        f"{max_len}; 0: no limit)")
    p.add_argument("--ratio", type=float, default=ratio,
                   help=f"drop training pairs whose length ratio exceeds this (default "
                        f"{ratio}; 0: no limit)")


def comma_separated(text: str) -> List[str]:
    """``a,b,,c`` -> ``[a, b, c]`` (the values of options such as ``--test-sets``)."""
    return [s for s in text.split(",") if s]


def raw_directory(args: argparse.Namespace) -> Path:
    """Where the raw files are: ``--raw``, or where ``--download`` puts them."""
    if not args.download:
        return Path(args.raw)
    return Path(args.raw_dir) if args.raw_dir else Path(args.out) / "raw"


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")


def report_errors(work: Callable[[], object]) -> int:
    """Run ``work``; 0, or 1 after printing a ``PrepError`` or an ``OSError`` as one line on stderr."""
    try:
        work()
    except PrepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:   # a full disk, a read-only output folder: the path, no traceback
        print(f"error: {describe_os_error(e)}", file=sys.stderr)
        return 1
    return 0


def main_with(job_fn: Callable[[argparse.Namespace], Job], downloads_fn: Callable[[argparse.Namespace], Sequence[str]],
              parser: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None) -> int:
    """Parse the options, build the job, download if asked, run the pipeline."""
    args = parser.parse_args(argv)
    setup_logging()

    def work() -> None:
        job = dataclasses.replace(job_fn(args), encoding=check_encoding(args.encoding))
        raw_dir = raw_directory(args)
        if args.download:
            download(downloads_fn(args), raw_dir)
        run(job, raw_dir, Path(args.out), workers=args.workers, keep_tmp=args.keep_tmp,
            binarise=not args.no_binarize)

    return report_errors(work)
