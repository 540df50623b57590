"""``python -m fairseq_sparse``: where the plugin is installed, and the commands it brings.

fairseq's ``--user-dir`` takes a directory, so ``--user-dir fairseq_sparse`` only works
from the repository root; from anywhere else ask the installed package for its own::

    fairseq-train DATA --user-dir $(python -m fairseq_sparse --user-dir) --arch transformer_sparse_mini ...
"""

import argparse
import ast
import sys
from pathlib import Path
from typing import List, Optional, Tuple

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGE = PACKAGE_DIR.name


def user_dir() -> str:
    """The installed package's directory: what fairseq's ``--user-dir`` needs, from any working directory."""
    return str(PACKAGE_DIR)


def _summary(path: Path, longest: int = 100) -> str:
    """The first sentence of a module's docstring, read without importing the module (imports pull in torch)."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(docstring.split("\n\n")[0].split()).replace("``", "")
    sentence = paragraph.split(". ")[0]
    return sentence if len(sentence) <= longest else sentence[: longest - 3].rstrip() + "..."


def _runs_as_main(path: Path) -> bool:
    source = path.read_text(encoding="utf-8")
    return 'if __name__ == "__main__"' in source or "if __name__ == '__main__'" in source


def entry_points() -> List[Tuple[str, str]]:
    """(module, summary) of every ``python -m`` entry point in the package, sorted by module.

    Found on disk rather than listed by hand, so that modules added or moved later are listed too:
    a module with an ``if __name__ == "__main__"`` block, or a subpackage with a ``__main__.py``.
    """
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
        if "__pycache__" in parts or path.name == "__init__.py":
            continue
        if path.name == "__main__.py":
            if len(parts) > 1:  # a subpackage run as ``python -m`` (this package's own entry is this file)
                init = path.with_name("__init__.py")
                found.append((".".join((PACKAGE,) + parts[:-1]), _summary(init if init.is_file() else path)))
        elif _runs_as_main(path):
            found.append((".".join((PACKAGE,) + parts), _summary(path)))
    return sorted(found)


def usage() -> str:
    from . import __version__

    points = entry_points()
    width = max(len(module) for module, _ in points)
    lines = [
        f"usage: python -m {PACKAGE} [--user-dir]",
        "",
        f"fairseq-sparse {__version__}: sparse attention for fairseq NMT, a fairseq --user-dir plugin.",
        "",
        "  --user-dir  print the installed package's directory, for fairseq's --user-dir from any directory:",
        f"              fairseq-train DATA --user-dir $(python -m {PACKAGE} --user-dir) --arch transformer_sparse_mini ...",
        "",
        "commands (python -m MODULE --help for their options):",
    ]
    lines += [f"  {module:<{width}}  {summary}" for module, summary in points]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}", add_help=False)  # usage() is the help
    parser.add_argument("--user-dir", action="store_true")
    parser.add_argument("-h", "--help", action="store_true")
    args = parser.parse_args(argv)
    print(user_dir() if args.user_dir else usage())
    return 0


if __name__ == "__main__":
    sys.exit(main())
