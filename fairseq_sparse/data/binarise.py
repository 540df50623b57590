"""Binarising prepared text with ``fairseq-preprocess``, into ``OUT/bin``.

It runs as a subprocess; the tests set ``BINARIZE_IN_PROCESS`` to call it in their own process
instead (importing fairseq once rather than once per dataset).
"""

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.data.text import read_lines, write_lines

logger = logging.getLogger("fairseq_sparse.data")

BINARIZE_IN_PROCESS = False


def find_tool(name: str) -> str:
    """``name`` next to this Python, else on PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file():
        return str(here)
    found = shutil.which(name)
    if not found:
        raise PrepError(f"{name} is neither next to {sys.executable} nor on PATH "
                        f"(pip install the fairseq fork first)")
    return found


def preprocess_command(out: Path, src: str, tgt: str, joined_dictionary: bool, workers: int,
                       srcdict: Optional[Path], tgtdict: Optional[Path]) -> List[str]:
    """The ``fairseq-preprocess`` command line for ``out/{train,valid,test}.{src,tgt}``."""
    cmd = [find_tool("fairseq-preprocess"), "--source-lang", src, "--target-lang", tgt,
           "--trainpref", str(out / "train"), "--validpref", str(out / "valid"),
           "--testpref", str(out / "test"), "--destdir", str(out / "bin"),
           "--workers", str(max(1, workers))]
    if joined_dictionary:
        cmd.append("--joined-dictionary")
    if srcdict is not None:
        cmd += ["--srcdict", str(srcdict)]
    if tgtdict is not None:
        cmd += ["--tgtdict", str(tgtdict)]
    return cmd


def binarize(out: Path, src: str, tgt: str, joined_dictionary: bool = True, workers: int = 1,
             srcdict: Optional[Path] = None, tgtdict: Optional[Path] = None) -> Path:
    """``fairseq-preprocess`` of ``out/{train,valid,test}.{src,tgt}`` into ``out/bin``."""
    dest = out / "bin"
    if dest.exists():
        shutil.rmtree(dest)
    cmd = preprocess_command(out, src, tgt, joined_dictionary, workers, srcdict, tgtdict)
    logger.info("binarising: %s", " ".join(cmd))
    _run_preprocess(cmd)
    return dest


def binarise_extra_splits(out: Path, src: str, tgt: str, splits: Dict[str, Tuple[Sequence[str], Sequence[str]]]) -> None:
    """Binarise more evaluation splits into a prepared dataset's ``out/bin`` with its own dictionaries:
    ``splits`` maps each new split's name to its (source, target) lines. Each file is written under a
    temporary name and renamed when complete, so a run cut short leaves no partial split."""
    bin_dir = out / "bin"
    dictionaries = {lang: bin_dir / f"dict.{lang}.txt" for lang in (src, tgt)}
    for path in dictionaries.values():
        if not path.is_file():
            raise PrepError(f"{path}: no such file (prepare and binarise the dataset first)")
    names = list(splits)
    with tempfile.TemporaryDirectory(dir=out, prefix=".extra_splits.") as tmp:
        work = Path(tmp)
        prefixes = []
        for name in names:
            sources, targets = splits[name]
            write_lines(work / f"{name}.{src}", sources)
            write_lines(work / f"{name}.{tgt}", targets)
            prefixes.append(str(work / name))
        dest = work / "bin"
        _run_preprocess([find_tool("fairseq-preprocess"), "--source-lang", src, "--target-lang", tgt,
                         "--srcdict", str(dictionaries[src]), "--tgtdict", str(dictionaries[tgt]),
                         "--testpref", ",".join(prefixes), "--destdir", str(dest), "--workers", "1"])
        for k, name in enumerate(names):
            produced = "test" if k == 0 else f"test{k}"  # fairseq-preprocess numbers its extra test prefixes
            for lang in (src, tgt):
                for suffix in ("bin", "idx"):
                    made = dest / f"{produced}.{src}-{tgt}.{lang}.{suffix}"
                    final = bin_dir / f"{name}.{src}-{tgt}.{lang}.{suffix}"
                    staged = final.with_name(final.name + ".tmp")
                    shutil.copyfile(made, staged)
                    os.replace(staged, final)


def joined_dictionary(trainpref: Path, src: str, tgt: str, dest: Path) -> Path:
    """The joined dictionary ``fairseq-preprocess`` builds from ``trainpref.{src,tgt}``, alone
    (``--dict-only``) in ``dest``; returns its path, a ``--srcdict`` for :func:`binarize`."""
    cmd = [find_tool("fairseq-preprocess"), "--source-lang", src, "--target-lang", tgt, "--joined-dictionary",
           "--dict-only", "--trainpref", str(trainpref), "--destdir", str(dest), "--workers", "1"]
    logger.info("dictionary: %s", " ".join(cmd))
    _run_preprocess(cmd)
    return dest / f"dict.{src}.txt"


def _run_preprocess(cmd: Sequence[str]) -> None:
    if BINARIZE_IN_PROCESS:
        _preprocess_in_process(cmd[1:])
        return
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:])
        raise PrepError(f"fairseq-preprocess failed with exit status {proc.returncode}")


def _preprocess_in_process(argv: Sequence[str]) -> None:
    from fairseq import options
    from fairseq_cli import preprocess

    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        preprocess.main(options.get_preprocessing_parser().parse_args(list(argv)))
    except SystemExit as e:
        raise PrepError(f"fairseq-preprocess failed with exit status {e.code}") from None
    finally:
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
                h.close()


def dictionary_size(dest: Path, lang: str) -> int:
    """The number of symbols in ``dest/dict.{lang}.txt`` (fairseq's 4 special symbols not included)."""
    return sum(1 for _ in read_lines(dest / f"dict.{lang}.txt"))


def vocab_to_fairseq_dict(vocab: Path, dest: Path) -> Path:
    """A one-word-a-line vocabulary (Stanford's ``vocab.*``) as a fairseq dict."""
    specials = {"<unk>", "<s>", "</s>", "<pad>"}
    words = [w for w in (line.split()[0] for line in read_lines(vocab) if line.strip())
             if w not in specials]
    write_lines(dest, (f"{w} 1" for w in dict.fromkeys(words)))
    return dest
