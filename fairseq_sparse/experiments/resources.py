"""What each kind of step asks a Slurm cluster for (``--launcher slurm``): partition, account, time, nodes,
GPUs, CPUs, memory, constraint and any other ``sbatch`` option.

Kinds: ``prep`` (data preparation), ``train``, ``finish`` (averaging, decodes for BLEU, analyses: what
finishes a trained model), ``timed`` (a decode whose running time a column reads: alone on its node) and
``report`` (the table's report, when the launcher does not wait for the jobs). Values come from the
profile's defaults, then the table's YAML (``slurm:``, one mapping per kind or ``all``), then the command
line (``--time train=2-00:00:00``, or ``--time 4:00:00`` for every kind), each replacing the one before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Dict, List, Optional, Sequence

from fairseq_sparse.experiments.errors import ConfigError

KINDS = ("prep", "train", "finish", "timed", "report")
TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def minutes(time: str) -> int:
    """A Slurm time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``) in whole
    minutes, rounded up."""
    match = TIME.match(str(time).strip())
    if not match:
        raise ConfigError(f"time {time!r} is not a Slurm time limit (MM, HH:MM:SS or D-HH:MM:SS)")
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # HH:MM:SS
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # MM:SS
        seconds = int(a) * 60 + int(b)
    else:  # MM
        seconds = int(a) * 60
    if seconds <= 0:
        raise ConfigError(f"time {time!r} is no time at all")
    return -(-seconds // 60)


@dataclass(frozen=True)
class Resources:
    """One kind of step's request. ``gpus`` and ``cpus`` are per node and per task (one task per node:
    fairseq starts one process per GPU itself); ``sbatch`` holds any other option as ``--name=value``."""

    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: str = "1:00:00"
    nodes: int = 1
    gpus: int = 0
    cpus: int = 1
    mem: Optional[str] = None
    constraint: Optional[str] = None
    sbatch: tuple = field(default_factory=tuple)

    @property
    def world_size(self) -> int:
        """The processes of a training: one per GPU of every node (one on a node without GPUs)."""
        return self.nodes * max(self.gpus, 1)

    def flags(self, exclusive: bool = False) -> List[str]:
        """The request as ``sbatch`` flags (what ``--test-only`` checks and what submitit writes)."""
        words = [f"--time={self.time}", f"--nodes={self.nodes}", "--ntasks-per-node=1", f"--cpus-per-task={self.cpus}"]
        words += [f"--{name}={value}" for name, value in (("partition", self.partition), ("account", self.account),
                                                           ("qos", self.qos), ("mem", self.mem),
                                                           ("constraint", self.constraint)) if value]
        if self.gpus:
            words.append(f"--gpus-per-node={self.gpus}")
        if exclusive:
            words.append("--exclusive")
        return words + list(self.sbatch)

    def executor_parameters(self) -> Dict[str, object]:
        """The same request as submitit's ``SlurmExecutor.update_parameters`` takes it."""
        extra = dict(_option(word) for word in self.sbatch)
        params: Dict[str, object] = {"time": minutes(self.time), "nodes": self.nodes, "ntasks_per_node": 1,
                                     "cpus_per_task": self.cpus}
        for name in ("partition", "account", "qos", "mem", "constraint"):
            if getattr(self, name):
                extra[name] = getattr(self, name)  # as given: submitit would rewrite a memory size in GB
        if self.gpus:
            params["gpus_per_node"] = self.gpus
        params["additional_parameters"] = extra
        return params


def _option(word: str) -> tuple:
    """``--name=value`` (or ``--flag``) as submitit's additional parameter."""
    if not word.startswith("--") or len(word) < 3:
        raise ConfigError(f"--sbatch {word!r}: give an sbatch option as --name=value or --flag")
    name, _, value = word[2:].partition("=")
    return name, value if value else True


DEFAULTS = {
    # the papers' models on GPUs: a day-long training is requeued from its last checkpoint at each limit
    "paper": {"prep": Resources(time="12:00:00", cpus=8), "train": Resources(time="2-00:00:00", gpus=1, cpus=8),
              "finish": Resources(time="6:00:00", gpus=1, cpus=4), "timed": Resources(time="6:00:00", gpus=1, cpus=4),
              "report": Resources(time="0:30:00", cpus=1)},
    # tiny models on the CPU: one core each, a few minutes
    "smoke": {kind: Resources(time="0:30:00", cpus=1, mem="2G") for kind in KINDS},
}

INTEGER_FIELDS = ("nodes", "gpus", "cpus")
STRING_FIELDS = ("partition", "account", "qos", "time", "mem", "constraint")


def _value(name: str, value: object, where: str) -> object:
    if name in INTEGER_FIELDS:
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
            raise ConfigError(f"{where}: {name} must be a whole number, got {value!r}")
        number = int(value)
        if number < (0 if name == "gpus" else 1):
            raise ConfigError(f"{where}: {name} must be at least {0 if name == 'gpus' else 1}, got {number}")
        return number
    if name == "sbatch":
        words = [value] if isinstance(value, str) else value
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ConfigError(f"{where}: sbatch takes options as --name=value strings, got {value!r}")
        for word in words:
            _option(word)
        return tuple(words)
    if not isinstance(value, (str, int)) or isinstance(value, bool) or not str(value).strip():
        raise ConfigError(f"{where}: {name} must be a non-empty string, got {value!r}")
    if name == "time":
        minutes(str(value))
    return str(value)


def _apply(resources: Resources, changes: Dict[str, object], where: str) -> Resources:
    known = {f.name for f in fields(Resources)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    values = {name: _value(name, value, where) for name, value in changes.items()}
    if "sbatch" in values:
        values["sbatch"] = resources.sbatch + values["sbatch"]
    return replace(resources, **values)


def from_yaml(per_kind: Dict[str, Resources], section: object, where: str) -> Dict[str, Resources]:
    """The table YAML's ``slurm:`` mapping (kind or ``all`` -> {key: value}) applied to ``per_kind``."""
    if section is None:
        return per_kind
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: slurm must map kinds of step ({', '.join(KINDS)} or all) to resources")
    unknown = sorted(set(section) - set(KINDS) - {"all"})
    if unknown:
        raise ConfigError(f"{where}: slurm: unknown kind(s) of step {unknown}; known: {', '.join(KINDS)}, all")
    result = dict(per_kind)
    for kind in ("all", *KINDS):
        changes = section.get(kind)
        if changes is None:
            continue
        if not isinstance(changes, dict):
            raise ConfigError(f"{where}: slurm: {kind} must be a mapping of resources, got {changes!r}")
        for target in (KINDS if kind == "all" else (kind,)):
            result[target] = _apply(result[target], changes, f"{where}: slurm: {kind}")
    return result


def from_command_line(per_kind: Dict[str, Resources], options: Dict[str, Optional[Sequence[str]]]) -> Dict[str, Resources]:
    """Command-line options (``--time [KIND=]VALUE``, repeatable) applied to ``per_kind``; a value without
    a kind applies to every kind, and a kind's own value wins over it whatever their order."""
    result = dict(per_kind)
    for name, values in options.items():
        if not values:
            continue
        for general in (True, False):
            for text in values:
                kind, sep, value = text.partition("=")
                specific = bool(sep) and kind in KINDS and not (name == "sbatch" and text.startswith("--"))
                if specific == general:
                    continue
                if not specific:
                    kind, value = "", text
                flag = f"--{name.replace('_', '-')}"
                for target in ((kind,) if specific else KINDS):
                    result[target] = _apply(result[target], {name: [value] if name == "sbatch" else value}, flag)
    return result


def resources_for(profile: str, table_section: object, where: str,
                  options: Dict[str, Optional[Sequence[str]]]) -> Dict[str, Resources]:
    per_kind = from_command_line(from_yaml(dict(DEFAULTS[profile]), table_section, where), options)
    for kind, res in per_kind.items():
        if kind != "train" and res.nodes > 1:
            raise ConfigError(f"--nodes: only trainings run on several nodes; {kind} asks for {res.nodes}")
        if res.nodes > 1 and res.gpus == 0:
            raise ConfigError(f"--nodes {res.nodes}: a training on several nodes needs GPUs (--gpus train=N): "
                              "fairseq's Slurm start runs one process per GPU")
    return per_kind
