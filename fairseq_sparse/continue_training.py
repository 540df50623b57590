"""Continue a finished run with new parameters or a new criterion, keeping its optimizer and schedule.

L0Drop's official recipe fine-tunes a converged model by *continuing* its training: Adam's moments,
the update count and so the decayed inverse-square-root learning rate carry on, and only the new
gate parameters start fresh. fairseq cannot say this: ``--restore-file`` keeps the optimizer state
only when the parameters and the criterion are unchanged (otherwise "please reset the optimizer"),
and ``--reset-optimizer`` / ``--finetune-from-model`` restart Adam with a fresh schedule.

``python -m fairseq_sparse.train ... --continue-from BASE.pt --continue-updates N`` writes, before
fairseq starts, the run's ``checkpoint_last.pt``: BASE's weights (the model adds what BASE lacks from
its initialisation), BASE's optimizer state mapped parameter by parameter *by name* to the new model
(a new parameter gets empty moments, as Adam gives any parameter on its first step), BASE's update
count, schedule state and data position, and the new criterion's name. fairseq then resumes it as
its own, so a continuation cut short resumes where it stopped, and ``--max-update`` becomes BASE's
updates + N.
"""

import logging
import os
from dataclasses import dataclass
from typing import Dict, List

import torch
from fairseq import checkpoint_utils, tasks
from omegaconf import DictConfig, OmegaConf

logger = logging.getLogger(__name__)


class ContinuationError(Exception):
    """The base run cannot be continued as asked (one line: what and why)."""


@dataclass(frozen=True)
class Continuation:
    base: str  # the base run's checkpoint (its checkpoint_last.pt: the optimizer state is needed)
    updates: int  # updates to train beyond the base's


def base_updates(state: dict, path: str) -> int:
    history = state.get("optimizer_history") or []
    if "averaged_from" in (state.get("extra_state") or {}):
        raise ContinuationError(f"{path} is an average of checkpoints: its optimizer state belongs to the newest "
                                "of them, not to the averaged weights. Continue from the base run's checkpoint_last.pt")
    if not history or state.get("last_optimizer_state") is None:
        raise ContinuationError(f"{path} has no optimizer state (saved with --no-save-optimizer-state?): continue from "
                                "the base run's checkpoint_last.pt")
    return int(history[-1]["num_updates"])


def trainable(model: torch.nn.Module, criterion: torch.nn.Module) -> Dict[str, torch.Size]:
    """Names and shapes of the parameters, in the order fairseq's trainer hands them to the optimizer."""
    named = [(f"model.{n}", p) for n, p in model.named_parameters()]
    named += [(f"criterion.{n}", p) for n, p in criterion.named_parameters()]
    return {name: p.shape for name, p in named if p.requires_grad}


def map_optimizer_state(optimizer_state: dict, base_names: List[str], new_shapes: Dict[str, torch.Size],
                        path: str) -> dict:
    """The base's optimizer state re-indexed for the new parameters (``new_shapes``' order), by name."""
    new_names = list(new_shapes)
    groups = optimizer_state["param_groups"]
    if len(groups) != 1 or len(groups[0]["params"]) != len(base_names):
        raise ContinuationError(
            f"{path}: its optimizer state covers {sum(len(g['params']) for g in groups)} parameter tensor(s) in "
            f"{len(groups)} group(s), its model has {len(base_names)}: a flattened (--fp16/--bf16 without "
            "--memory-efficient-*) or sharded optimizer cannot be mapped by parameter name")
    missing = sorted(set(base_names) - set(new_names))
    if missing:
        raise ContinuationError(f"{path}: the new model lacks {len(missing)} of the base's parameters "
                                f"(e.g. {missing[:3]}): a continuation may add parameters, not remove them")
    index = {name: i for i, name in enumerate(new_names)}
    state = {}
    for old, name in zip(groups[0]["params"], base_names):
        saved = optimizer_state["state"].get(old)
        if saved is None:
            continue
        for key, value in saved.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != new_shapes[name]:
                raise ContinuationError(f"{path}: {name} is {tuple(value.shape)} in the base's optimizer state and "
                                        f"{tuple(new_shapes[name])} in the new model (other sizes?)")
        state[index[name]] = saved
    return {"state": state, "param_groups": [{**groups[0], "params": list(range(len(new_names)))}]}


def check_same_schedule(cfg: DictConfig, base_cfg: DictConfig, path: str) -> None:
    for group, what in (("optimizer", "optimizer"), ("lr_scheduler", "learning-rate scheduler")):
        ours, theirs = cfg[group]._name, base_cfg[group]._name
        if ours != theirs:
            raise ContinuationError(f"{path} was trained with the {what} {theirs!r}, this run uses {ours!r}: a "
                                    "continuation keeps the base's (use --finetune-from-model to start afresh)")


def check_same_shape(cfg: DictConfig, base_cfg: DictConfig, path: str) -> None:
    """A continuation may change the methods and add L0Drop's gates; the shape is the base's (a change of the
    heads alone would keep every parameter's size and go unnoticed)."""
    from fairseq_sparse.core.checkpoint_identity import SHAPE, CheckpointIdentity, differences

    shape = {f"--{name.replace('_', '-')}" for name in SHAPE}
    for what, theirs, ours in differences(CheckpointIdentity.of(base_cfg), CheckpointIdentity.of(cfg)):
        if what in shape:
            raise ContinuationError(f"{path} was trained with {what} {theirs!r}, this run asks for {ours!r}: a "
                                    "continuation keeps the base's shape")


def continuation_state(cfg: DictConfig, base: dict, path: str) -> dict:
    """The checkpoint that makes fairseq resume ``base`` as a run of ``cfg`` (new model and criterion)."""
    base_cfg = base["cfg"]
    check_same_shape(cfg, base_cfg, path)
    task = tasks.setup_task(cfg.task)
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    base_model, base_criterion = task.build_model(base_cfg.model), task.build_criterion(base_cfg.criterion)
    shapes = trainable(model, criterion)
    optimizer_state = map_optimizer_state(base["last_optimizer_state"], list(trainable(base_model, base_criterion)),
                                          shapes, path)
    history = {**base["optimizer_history"][-1], "criterion_name": criterion.__class__.__name__}
    added = len(shapes) - len(optimizer_state["state"])
    logger.info(f"continuing {path} at update {history['num_updates']}: optimizer state of "
                f"{len(optimizer_state['state'])} parameter tensors kept, {added} start afresh")
    # the configuration as fairseq's trainer saves it (plain containers: the safe loader rejects omegaconf's types)
    plain_cfg = OmegaConf.to_container(base_cfg, resolve=True, enum_to_str=True)
    return {**base, "cfg": plain_cfg, "last_optimizer_state": optimizer_state,
            "optimizer_history": [*base["optimizer_history"][:-1], history]}


def prepare(cfg: DictConfig, continuation: Continuation) -> None:
    """Write the run's checkpoint_last.pt from the base (unless the run has one: then it resumes) and set
    ``--max-update`` to the base's updates + ``continuation.updates``."""
    if continuation.updates <= 0:
        raise ContinuationError(f"--continue-updates must be a positive number of updates, got {continuation.updates}")
    for option, given in (("--finetune-from-model", cfg.checkpoint.finetune_from_model),
                          ("--reset-optimizer", cfg.checkpoint.reset_optimizer),
                          ("--reset-lr-scheduler", cfg.checkpoint.reset_lr_scheduler),
                          ("--restore-file", cfg.checkpoint.restore_file != "checkpoint_last.pt")):
        if given:
            raise ContinuationError(f"--continue-from continues the base run's optimizer and schedule: {option} "
                                    "contradicts it")
    if not os.path.isfile(continuation.base):
        raise ContinuationError(f"--continue-from {continuation.base}: no such checkpoint")
    base = checkpoint_utils.load_checkpoint_to_cpu(continuation.base)
    updates = base_updates(base, continuation.base)
    check_same_schedule(cfg, base["cfg"], continuation.base)
    epoch = base["extra_state"]["train_iterator"]["epoch"]
    if cfg.optimization.max_epoch and cfg.optimization.max_epoch < epoch:
        raise ContinuationError(f"--max-epoch {cfg.optimization.max_epoch} is already past: the base run stopped "
                                f"in epoch {epoch} (a continuation counts epochs on; leave --max-epoch out)")
    cfg.optimization.max_update = updates + continuation.updates
    own = os.path.join(cfg.checkpoint.save_dir, "checkpoint_last.pt")
    if os.path.exists(own):
        logger.info(f"{own} exists: resuming the continuation of {continuation.base} up to update "
                    f"{cfg.optimization.max_update}")
        return
    os.makedirs(cfg.checkpoint.save_dir, exist_ok=True)
    # fairseq's own writer: a temporary file renamed into place, so a kill leaves no half checkpoint
    checkpoint_utils.torch_persistent_save(continuation_state(cfg, base, continuation.base), own)
