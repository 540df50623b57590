"""``--dry-run``: every command of a plan parsed by its own tool's parser (fairseq-train's,
fairseq-generate's, a data-prep script's), nothing run: a table's arguments checked in seconds."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
import sys
from pathlib import Path
from typing import List

from fairseq_sparse.experiments.errors import ConfigError
from fairseq_sparse.experiments.plan import Plan, Step


def _load_script(path: Path):
    spec = importlib.util.spec_from_file_location(f"prep_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


_PARSED: set = set()  # argument lists already parsed, as _shape gives them: rows and seeds share most of them
_INT, _FLOAT = re.compile(r"-?\d+"), re.compile(r"-?(\d+\.\d*|\.\d+|\d+)([eE]-?\d+)?")


def _shape(tool: str, argument: str) -> str:
    """What decides whether an argument parses: paths left out, and for fairseq's own parsers (a
    second each: hydra composes the whole configuration) a number's type, not its value. No option of
    fairseq or of this plugin limits a number to listed choices, so seeds, k, learning rates and sizes
    that differ in value parse alike."""
    if "/" in argument:
        return "PATH"
    if tool in ("fairseq-train", "fairseq-generate", "fairseq_sparse.train"):
        if _INT.fullmatch(argument):
            return "INT"
        if _FLOAT.fullmatch(argument):
            return "FLOAT"
    return argument


def check_parses(step: Step) -> None:
    """Parse the step's arguments with the parser of the tool it runs; raise ConfigError if they do not."""
    from fairseq import options

    import fairseq_sparse  # noqa: F401  (registers the architectures and criteria)

    argv = step.argv
    tool = argv[2] if argv[0] == sys.executable and argv[1] == "-m" else Path(argv[0]).name
    key = (Path(argv[0]).name, *(_shape(tool, a) for a in argv[1:]))
    if key in _PARSED:
        return
    try:
        if argv[0] == sys.executable and argv[1] == "-m":
            module = "fairseq_sparse.analysis.cli" if argv[2] == "fairseq_sparse.analysis" else argv[2]
            if module == "fairseq_sparse.train":  # fairseq-train's parser, with the options it adds
                importlib.import_module(module).parse(argv[3:])
            else:
                importlib.import_module(module).build_parser().parse_args(argv[3:])
        elif argv[0] == sys.executable:
            _load_script(Path(argv[1])).build_parser().parse_args(argv[2:])
        else:
            tool = Path(argv[0]).name
            if tool == "fairseq-preprocess":
                options.get_preprocessing_parser().parse_args(argv[1:])
            elif tool in ("fairseq-train", "fairseq-generate"):
                from fairseq.dataclass.utils import convert_namespace_to_omegaconf

                parser = options.get_training_parser() if tool == "fairseq-train" else options.get_generation_parser()
                convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, input_args=argv[1:]))
            else:
                raise ConfigError(f"no parser known for {tool}")
    except SystemExit as e:
        raise ConfigError(f"{step.label}: the command does not parse (exit {e.code}):\n  {shlex.join(argv)}") from None
    _PARSED.add(key)


def dry_run(plan: Plan, steps: List[Step]) -> None:
    for step in steps:
        check_parses(step)
        print(f"ok  {step.label}: {shlex.join(step.argv)}")
    print(f"{plan.table.name} ({plan.table.profile}): {len(steps)} commands parse")
