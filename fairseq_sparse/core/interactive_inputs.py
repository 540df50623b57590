"""fairseq-interactive's inputs longer than the model reads: one line each, skipped, counted at the end.

fairseq-interactive batches its input through the task's batch iterator, which raises on the first line
longer than the model's positions ("Size of sample #0 is invalid ... skip this example with
--skip-invalid-size-inputs-valid-test", a traceback that ends the session) or, with that option, drops
it with a warning that gives sample ids instead of input numbers. fairseq-interactive looks up its
``make_batches`` when it batches each buffer of input, after loading the plugin (``--user-dir``): the
plugin hands it one that takes the over-long lines out first, says so for each, and gives the kept
lines' batches their input numbers back, so every other line is translated as before.
"""

import atexit
import sys
from typing import List, Optional

INTERACTIVE = "fairseq_cli.interactive"
PROGRAM = "fairseq-interactive"


def source_limit(max_positions) -> Optional[int]:
    """The most source tokens the task and the models take (fairseq's resolved max_positions)."""
    if isinstance(max_positions, (tuple, list)):
        max_positions = max_positions[0]
    return max_positions if isinstance(max_positions, int) else None


class SkippedInputs:
    """fairseq-interactive's make_batches, with over-long inputs skipped one line each."""

    def __init__(self, make_batches):
        self.make_batches = make_batches
        self.seen = 0  # inputs read so far: fairseq-interactive numbers its inputs the same way (start_id)
        self.skipped = 0
        self.limit: Optional[int] = None

    def __call__(self, lines: List[str], cfg, task, max_positions, encode_fn):
        first, self.seen = self.seen, self.seen + len(lines)
        limit = source_limit(max_positions)
        if limit is None:
            yield from self.make_batches(lines, cfg, task, max_positions, encode_fn)
            return
        # constraints follow the source after tabs; make_batches strips them before it encodes the source
        sources = [line.split("\t")[0] for line in lines] if cfg.generation.constraints else lines
        _, lengths = task.get_interactive_tokens_and_lengths(sources, encode_fn)
        kept = [i for i, length in enumerate(lengths) if length <= limit]
        for i, length in enumerate(lengths):
            if length > limit:
                print(f"{PROGRAM}: input {first + i} skipped: {length} tokens, the model reads at most {limit} "
                      "(--max-source-positions)", file=sys.stderr, flush=True)
        if len(kept) == len(lines):
            yield from self.make_batches(lines, cfg, task, max_positions, encode_fn)
            return
        if not self.skipped:
            atexit.register(self.report)
        self.skipped += len(lines) - len(kept)
        self.limit = limit
        if not kept:
            return
        for batch in self.make_batches([lines[i] for i in kept], cfg, task, max_positions, encode_fn):
            ids = batch.ids.new_tensor([kept[i] for i in batch.ids.tolist()])
            yield batch._replace(ids=ids)

    def report(self) -> None:
        print(f"{PROGRAM}: skipped {self.skipped} input(s) longer than {self.limit} tokens", file=sys.stderr,
              flush=True)


def skip_long_inputs_in_interactive() -> None:
    """Hand fairseq-interactive (when it is the running command) the make_batches above."""
    main = sys.modules.get("__main__")
    modules = [sys.modules.get(INTERACTIVE)]
    if getattr(getattr(main, "__spec__", None), "name", None) == INTERACTIVE:  # python -m fairseq_cli.interactive
        modules.append(main)
    for module in modules:
        batches = getattr(module, "make_batches", None)
        if batches is not None and not isinstance(batches, SkippedInputs):
            module.make_batches = SkippedInputs(batches)
