"""A `transformers` `Trainer`'s model and first batch as a workload to search, without a builder.

    ref = write_workload(trainer, "trainer_workload")   # "trainer_workload/build.py:build"
    # budgettune search --workload trainer_workload/build.py:build --max-mem 20GB

The folder gets the model's ``config.json``, the `Trainer`'s first training batch
(``batch.pt``, as its data loader and collator make it), ``trainer.json`` (the model class,
its dtype, the mixed precision and the optimizer the `Trainer` would build) and a three-line
``build.py``. A trial builds the model again from the config, with random weights (memory
and step time do not depend on their values), on the trial's device, and steps it as the
`Trainer` does: ``model(**batch).loss``, backward, the optimizer's step.

What it cannot see is said in ``build.py`` and logged: a ``compute_loss`` of your own, label
smoothing, gradient clipping and accumulation (a trial steps one micro-batch), the
scheduler, frozen parameters and adapters (a `peft` model is refused: write a builder, as in
``examples/wrapped_decoder.py``). The model's dropout is kept, as the `Trainer` runs it (its
saved masks are part of the peak: issue 45, a job peaked 14 % over a pin measured without);
``-o keep_dropout=false`` sets it to 0, as ``hf:`` does, and a job applying such a pin with
dropout on is warned. With dropout, a budget below 1.0 that recomputes a random op re-draws
its mask and fails the numerics check (it would train on wrong gradients): the search
excludes it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from budgettune.errors import UsageError, WorkloadError, one_line, shown_value
from budgettune.workload import Workload
from budgettune.workloads.hf import zero_dropout

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

BUILD_FILE = "build.py"
TRAINER_FILE = "trainer.json"
BATCH_FILE = "batch.pt"
_MARKER = "written by budgettune.integrations.transformers.write_workload"
"""In every ``build.py`` `write_workload` writes: its folder may be written again."""
_BUILD_TEMPLATE = '''"""A budgettune workload: a transformers Trainer's {model_class}
(its config.json, random weights) and first batch ({batch}),
{marker}.

    budgettune search --workload {reference} --max-mem 20GB

Not captured from the Trainer: {not_captured}.
"""

from pathlib import Path

from budgettune.integrations.trainer_workload import load_saved_workload


def build(device, keep_dropout=True):
    return load_saved_workload(Path(__file__).resolve().parent, device, keep_dropout=keep_dropout)
'''


def _optimizer_entry(trainer: Any, model: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """The optimizer the `Trainer` uses or would build: ``{"class": "pkg.mod.Cls", "kwargs":
    {...}}`` (JSON values only), and what of it is not captured."""
    import inspect

    missed: list[str] = []
    if trainer.optimizer is not None:
        cls, kwargs = type(trainer.optimizer), dict(trainer.optimizer.defaults)
    else:
        cls, kwargs = trainer.get_optimizer_cls_and_kwargs(trainer.args, model)
        kwargs = {**kwargs, "weight_decay": trainer.args.weight_decay}
    accepted = inspect.signature(cls.__init__).parameters
    kept: dict[str, Any] = {}
    for key, value in kwargs.items():
        value = list(value) if isinstance(value, tuple) else value
        if key not in accepted:
            continue
        if isinstance(value, (bool, int, float, str, list)) or value is None:
            kept[key] = value
        else:
            missed.append(f"optimizer argument {key}")
    path = f"{cls.__module__}.{cls.__qualname__}"
    if "<" in path:  # defined in a function: not importable by the trial
        missed.append(f"optimizer {path} (AdamW is used)")
        return None, missed
    return {"class": path, "kwargs": kept}, missed


def _not_captured(trainer: Any, model: Any) -> list[str]:
    import transformers

    args = trainer.args
    missed = []
    if type(trainer).compute_loss is not transformers.Trainer.compute_loss or getattr(
        trainer, "compute_loss_func", None
    ):
        missed.append("your compute_loss (the model's own loss is used)")
    if getattr(args, "label_smoothing_factor", 0):
        missed.append("label smoothing")
    if getattr(args, "max_grad_norm", 0):
        missed.append(f"gradient clipping (max_grad_norm={args.max_grad_norm})")
    if getattr(args, "gradient_accumulation_steps", 1) > 1:
        missed.append(f"gradient accumulation ({args.gradient_accumulation_steps} micro-batches)")
    checkpointing = ("activation_checkpointing", "gradient_checkpointing")
    if any(getattr(args, name, False) for name in checkpointing):
        missed.append("the Trainer's gradient checkpointing (the search chooses AC itself)")
    if not all(p.requires_grad for p in model.parameters()):
        missed.append("frozen parameters (every parameter trains)")
    missed.append("the learning-rate scheduler")
    return missed


def write_workload(trainer: Any, folder: str | Path) -> str:
    """Write a workload of a `Trainer`'s model and first batch (see the module docstring).

    Args:
        trainer: a `transformers.Trainer` with a train dataset.
        folder: where to write (made if missing; its files are replaced).

    Returns:
        The workload reference, ``FOLDER/build.py:build``.

    Raises:
        WorkloadError: the model is not a class `transformers` exports (a `peft` model, a
            model of remote code), or the batch is not a mapping of tensors.
    """
    import torch
    import transformers

    if not isinstance(folder, (str, os.PathLike)) or not os.fspath(folder).strip():
        raise UsageError(f"write_workload: folder takes a path; got {shown_value(folder)}")  # P6-8
    if not (hasattr(trainer, "model") and hasattr(trainer, "get_train_dataloader")):  # P7-6
        raise UsageError(
            f"write_workload: takes a transformers Trainer; got {shown_value(trainer)}"
        )
    model = trainer.model
    cls = type(model)
    if not isinstance(model, transformers.PreTrainedModel) or (
        getattr(transformers, cls.__name__, None) is not cls
    ):
        raise WorkloadError(
            f"write_workload: the Trainer's model is a {cls.__module__}.{cls.__name__}, not a "
            "model class transformers exports; write a builder (README: Your own workload)"
        )
    try:
        first = next(iter(trainer.get_train_dataloader()))
    except (ValueError, StopIteration) as exc:  # no train_dataset, or an empty one
        raise UsageError(
            f"write_workload: the Trainer gives no training batch ({one_line(exc)}); "
            "give it a train_dataset"
        ) from None
    if not isinstance(first, Mapping):
        raise WorkloadError(
            f"write_workload: the Trainer's batches are {type(first).__name__}, not a mapping "
            "of tensors; write a builder (README: Your own workload)"
        )
    batch = {k: v.detach().cpu() for k, v in first.items() if isinstance(v, torch.Tensor)}
    optimizer, missed = _optimizer_entry(trainer, model)
    missed = [*missed, *_not_captured(trainer, model)]
    missed += [f"batch entry {k!r} (not a tensor)" for k in first if k not in batch]
    args = trainer.args
    out = Path(folder)
    check_workload_folder(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(str(out))
        torch.save(batch, out / BATCH_FILE)
    except (OSError, RuntimeError) as exc:  # a folder under a file, batch.pt a folder (P6-8,
        raise UsageError(  # P7-4: torch.save's own error is a RuntimeError)
            f"write_workload: cannot write into {out} ({one_line(exc)})"
        ) from None
    entry = {
        "model_class": cls.__name__,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "autocast_dtype": "bfloat16" if args.bf16 else "float16" if args.fp16 else None,
        "optimizer": optimizer,
        "not_captured": missed,
    }
    (out / TRAINER_FILE).write_text(json.dumps(entry, indent=2) + "\n")
    reference = f"{out / BUILD_FILE}:build"
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in batch.items())
    (out / BUILD_FILE).write_text(
        _BUILD_TEMPLATE.format(
            marker=_MARKER,
            model_class=cls.__name__,
            batch=shapes,
            reference=reference,
            not_captured="; ".join(missed),
        )
    )
    log.warning("wrote %s; not captured from the Trainer: %s", reference, "; ".join(missed))
    return reference


WRITTEN_FILES = (BUILD_FILE, TRAINER_FILE, BATCH_FILE, "config.json", "generation_config.json")
"""What `write_workload` writes into its folder."""


def check_workload_folder(folder: Path) -> None:
    """Refuse a folder `write_workload` must not write into (issue 48: it replaced a user's own
    ``build.py`` and ``config.json``, and wrote through a ``trainer.json`` link): one whose
    files of those names are not its own (no ``build.py`` it wrote beside them), a file that
    is a symbolic or hard link, or a path that is not a folder.

    Raises:
        UsageError: naming the file and what to do instead.
    """
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"write_workload: {folder} is not a folder")
    for name in WRITTEN_FILES:
        path = folder / name
        linked = path.is_file() and not path.is_symlink() and path.stat().st_nlink > 1
        if path.is_symlink() or (path.exists() and not path.is_file()) or linked:
            what = (  # a hard link's other name would be written through (P9-4)
                "a symbolic link"
                if path.is_symlink()
                else "a hard link to another file"
                if linked
                else "not a regular file"
            )
            raise UsageError(  # a FIFO would block the write, a folder fail it (P7-4, P7-5)
                f"write_workload: {path} is {what}; name a folder of its own for the workload"
            )
    build = folder / BUILD_FILE
    ours = build.is_file() and _MARKER in build.read_text(errors="replace")[:2000]
    taken = [name for name in WRITTEN_FILES if (folder / name).exists()]
    if taken and not ours:
        raise UsageError(
            f"write_workload: {folder} holds {', '.join(taken)} that write_workload did not "
            "write; name a new folder for the workload (its files would be replaced)"
        )


def _import_class(path: str) -> Any:
    module_name, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise WorkloadError(f"the Trainer's optimizer {path} cannot be imported: {exc}") from None


def load_saved_workload(
    folder: Path, device: torch.device, *, keep_dropout: bool = True
) -> Workload:
    """Build the workload `write_workload` saved in ``folder`` on ``device``.

    Raises:
        WorkloadError: a file is missing or the optimizer cannot be imported.
    """
    import torch
    import transformers

    try:
        entry = json.loads((folder / TRAINER_FILE).read_text())
        batch = torch.load(folder / BATCH_FILE, weights_only=True)
        config = transformers.AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"{folder}: not a folder write_workload wrote ({exc})") from None
    if not keep_dropout:
        zero_dropout(config)
    with torch.device(device):
        model = getattr(transformers, entry["model_class"])(config)
    model = model.to(dtype=getattr(torch, entry["dtype"])).train()
    optimizer = entry.get("optimizer")
    optimizer_class: Any = torch.optim.AdamW
    kwargs: dict[str, Any] = {"lr": 5e-5}
    if optimizer is not None:
        optimizer_class = _import_class(optimizer["class"])
        kwargs = {
            k: tuple(v) if isinstance(v, list) else v for k, v in optimizer["kwargs"].items()
        }
    autocast = entry.get("autocast_dtype")
    return Workload(
        model=model,
        batch={k: v.to(device) for k, v in batch.items()},
        loss=_model_loss,
        optimizer=lambda params: optimizer_class(params, **kwargs),
        autocast_dtype=getattr(torch, autocast) if autocast else None,
    )


def _model_loss(model: Any, batch: Mapping[str, Any]) -> Any:
    return model(**batch).loss
