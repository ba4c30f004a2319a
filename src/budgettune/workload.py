"""The `Workload` contract users write, and loading it from a reference (its fingerprint:
`budgettune.workload_fingerprint`, re-exported here).

A workload reference is ``builtin:NAME``, ``path/to/file.py:fn`` or ``pkg.module:fn``; ``fn`` is
called as ``fn(device, **options)`` and returns a `Workload`. This module does not import torch at
module level: the parent process (CLI, search) imports it too, and must never initialise CUDA.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from budgettune.blocks import find_blocks
from budgettune.errors import WorkloadError, one_line, shown_value
from budgettune.hub import hub_config_folder, is_hub_id
from budgettune.workload_builtins import (  # noqa: F401 - re-exported
    BUILTIN_MAX_LAYERS,
    BUILTINS,
    BuiltinWorkload,
    check_builtin_bounds,
    check_builtin_sizes,
)
from budgettune.workload_fingerprint import (  # noqa: F401 - re-exported
    WorkloadFingerprint,
    fingerprint,
)

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """One training step to tune: a model, a batch, a loss and an optimizer factory."""

    model: nn.Module
    """The model, already on the target device."""
    batch: Any
    """Any pytree of tensors on the device, passed unchanged to ``loss``."""
    loss: Callable[[nn.Module, Any], torch.Tensor]
    """``loss(model, batch) -> scalar tensor``. budgettune passes the (compiled) model."""
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None
    """``optimizer(params) -> Optimizer``; AdamW(lr=1e-4) when omitted."""
    blocks: Sequence[nn.Module] | None = None
    """The repeated blocks for block AC (e.g. ``model.layers``); discovered when omitted."""
    autocast_dtype: torch.dtype | None = None
    """Run forward and loss under `torch.autocast` with this dtype when set."""
    parallelize: Callable[[nn.Module, Any], nn.Module | None] | None = None
    """Sharded trials: ``parallelize(model, mesh)`` shards the model (FSDP2, TP...), called on
    every rank after block AC and per-block compile; by default `fully_shard` on each block
    and at the root (torchtitan's order). Returns the model (or None: sharded in place)."""


_ACCEPTED_FORMS = "builtin:NAME, hf:DIR_OR_TYPE, path/to/file.py:fn or pkg.module:fn"
HF_INSTALL_HINT = "hf: workloads need transformers: pip install 'budgettune[hf]'"
_HF_TARGET = "budgettune.workloads.hf:build"
_MODULE_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_log = logging.getLogger(__name__)


def builtin_workload(name: str) -> BuiltinWorkload:
    """The built-in workload called ``name``.

    Raises:
        WorkloadError: when there is no such built-in; the message lists the known names.
    """
    for entry in BUILTINS:
        if entry.name == name:
            return entry
    known = ", ".join(entry.name for entry in BUILTINS)
    raise WorkloadError(f"unknown built-in workload {name!r}; known: {known}")


@dataclass(frozen=True, kw_only=True, slots=True)
class _Reference:
    """A parsed workload reference."""

    kind: str
    """``builtin``, ``hf``, ``file`` or ``module``."""
    location: str
    """The builtin name, the file path or the dotted module name."""
    function: str
    """The builder's name (``build`` for builtins)."""


def _parse(ref: str) -> _Reference:
    head, sep, function = ref.strip().rpartition(":")
    if not sep or not head or not function.isidentifier():
        raise WorkloadError(f"workload reference {ref!r} is malformed; write {_ACCEPTED_FORMS}")
    if head.endswith(".py") or "/" in head or os.sep in head:
        return _Reference(kind="file", location=head, function=function)
    if _MODULE_PATTERN.match(head):
        return _Reference(kind="module", location=head, function=function)
    raise WorkloadError(f"workload reference {ref!r} is malformed; write {_ACCEPTED_FORMS}")


def _parse_builtin(ref: str) -> _Reference:
    # `builtin:tiny-gpt` has a name that is not an identifier, so it is split before `_parse`.
    name = ref.strip().removeprefix("builtin:")
    builtin_workload(name)
    return _Reference(kind="builtin", location=name, function="build")


def _parse_hf(ref: str) -> _Reference:
    source = ref.strip().removeprefix("hf:")
    if not source:
        raise WorkloadError(
            f"workload reference {ref!r}: write hf:DIR (a folder with config.json), "
            "hf:MODEL_TYPE (e.g. hf:gpt2, hf:llama) or hf:ORG/NAME (a Hub id)"
        )
    return _Reference(kind="hf", location=source, function="build")


def _reference(ref: str) -> _Reference:
    if ref.strip().startswith("builtin:"):
        return _parse_builtin(ref)
    if ref.strip().startswith("hf:"):
        return _parse_hf(ref)
    return _parse(ref)


def _defines(tree: ast.Module, name: str) -> bool:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return True
        elif isinstance(node, ast.AnnAssign):
            if isinstance(node.target, ast.Name) and node.target.id == name:
                return True
        elif isinstance(node, ast.ImportFrom | ast.Import):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return True
    return False


def check_reference(ref: str, options: Mapping[str, Any] | None = None) -> None:
    """Check a workload reference in the parent, without importing user code or torch (and a
    built-in's size ``options`` against their bounds).

    ``builtin:NAME`` must name a built-in; for ``path/to/file.py:fn`` the file must exist and
    define ``fn`` at top level (read with `ast`); for ``pkg.module:fn`` the module must be
    findable (`importlib.util.find_spec`, which does not import it).

    Raises:
        WorkloadError: with one line saying what is wrong and the accepted forms.
    """
    parsed = _reference(ref)
    if parsed.kind == "builtin" and options:
        check_builtin_bounds(ref, options)
    if parsed.kind == "hf":
        if importlib.util.find_spec("transformers") is None:
            raise WorkloadError(HF_INSTALL_HINT)
        if is_hub_id(parsed.location):
            hub_config_folder(parsed.location)  # fetched (or found cached) once, here
            return
        folder = Path(parsed.location)
        if folder.exists() and not (folder / "config.json").is_file():
            raise WorkloadError(f"{ref}: no config.json in the folder {parsed.location}")
        if not folder.exists() and "/" in parsed.location:
            raise WorkloadError(f"{ref}: no such folder (a Hub id is ORG/NAME)")
    elif parsed.kind == "file":
        path = Path(parsed.location)
        if not path.is_file():
            raise WorkloadError(f"workload file {parsed.location} not found (reference {ref!r})")
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except (SyntaxError, ValueError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"workload file {parsed.location} does not parse: {exc}") from None
        if not _defines(tree, parsed.function):
            raise WorkloadError(
                f"workload file {parsed.location} defines no top-level {parsed.function!r}"
            )
    elif parsed.kind == "module":
        try:
            found = importlib.util.find_spec(parsed.location)
        except (ImportError, ValueError):
            # find_spec imports parent packages; a missing parent raises instead of returning None
            found = None
        if found is None:
            raise WorkloadError(
                f"workload module {parsed.location} not found (reference {ref!r}); "
                "is its package installed in this environment?"
            )


def reference_origin(ref: str) -> str:
    """Where the code a workload reference would run comes from, for a user to check first.

    Call `check_reference` before: this imports nothing, and says e.g. ``build from the file
    /abs/train.py``, ``build from the module pkg.mod (/site-packages/pkg/mod.py)`` or
    ``the built-in tiny-gpt``.

    Raises:
        WorkloadError: a malformed reference.
    """
    parsed = _reference(ref)
    if parsed.kind == "file":
        return f"{parsed.function} from the file {Path(parsed.location).resolve()}"
    if parsed.kind == "module":
        found = importlib.util.find_spec(parsed.location)
        where = f" ({found.origin})" if found is not None and found.origin else ""
        return f"{parsed.function} from the module {parsed.location}{where}"
    if parsed.kind == "builtin":
        return f"the built-in {parsed.location}"
    if is_hub_id(parsed.location):
        return f"a transformers model from the Hub config of {parsed.location} (random weights)"
    return f"a transformers model from {parsed.location} (random weights)"


def _import_file(path: Path) -> ModuleType:
    resolved = path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:8]
    # A private name, so a user's `train.py` or `types.py` never shadows a real module.
    stem = re.sub(r"\W", "_", resolved.stem)
    name = f"_budgettune_workload_{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"workload file {path} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    # As `python train.py` would: the file's folder is importable, so it can import its siblings.
    if str(resolved.parent) not in sys.path:
        sys.path.insert(0, str(resolved.parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def preload_modules(ref: str) -> tuple[str, ...]:
    """The modules a trial of workload ``ref`` imports that a trial server may import ahead:
    budgettune's own builders and, for ``hf:``, transformers and the model type's modeling
    module (none for a user's file or module: its import is the user's code, run in the
    trial). An unparsable reference has none (the trial reports it)."""
    try:
        parsed = _reference(ref)
    except WorkloadError:
        return ()
    if parsed.kind == "builtin":
        try:
            return (builtin_workload(parsed.location).target.partition(":")[0],)
        except WorkloadError:
            return ()
    if parsed.kind != "hf" or importlib.util.find_spec("transformers") is None:
        return ()
    modules = ["transformers", "transformers.modeling_utils", _HF_TARGET.partition(":")[0]]
    model_type = parsed.location
    if re.fullmatch(r"[a-z0-9_-]+", model_type) and not Path(model_type).exists():
        name = model_type.replace("-", "_")
        modules.append(f"transformers.models.{name}.modeling_{name}")
    return tuple(modules)


def _resolve(ref: str, parsed: _Reference) -> Callable[..., Any]:
    if parsed.kind in ("builtin", "hf"):
        target = _HF_TARGET if parsed.kind == "hf" else builtin_workload(parsed.location).target
        module_name, _, function = target.partition(":")
        return cast(Callable[..., Any], getattr(importlib.import_module(module_name), function))
    if parsed.kind == "file":
        check_reference(ref)
    try:
        if parsed.kind == "file":
            module = _import_file(Path(parsed.location))
        else:
            module = importlib.import_module(parsed.location)
    except WorkloadError:
        raise
    except Exception as exc:
        _log.error("importing workload %s failed", ref, exc_info=exc)
        raise WorkloadError(
            f"importing workload {ref} raised {one_line(exc, with_type=True)} "
            "(full traceback in the trial log)"
        ) from exc
    fn = getattr(module, parsed.function, None)
    if not callable(fn):
        raise WorkloadError(
            f"workload {ref}: {parsed.location} has no function {parsed.function!r}"
        )
    return cast(Callable[..., Any], fn)


def _check_options(ref: str, fn: Callable[..., Any], options: Mapping[str, Any]) -> None:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    accepted = [p.name for p in parameters[1:] if p.kind in named]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise WorkloadError(
            f"workload {ref} has no option(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(accepted) or 'none'}"
        )
    for p in parameters[1:]:  # a flag given a word: "maybe" was a true string (issue 48)
        flag = p.annotation in (bool, "bool") or isinstance(p.default, bool)
        if flag and not isinstance(options.get(p.name, False), bool):
            raise WorkloadError(
                f"workload {ref}: option {p.name} takes true or false, "
                f"got {shown_value(options[p.name])}"
            )


def load_workload(
    ref: str, device: torch.device, options: Mapping[str, Any] | None = None
) -> Workload:
    """Resolve a workload reference and build it: ``fn(device, **options)``.

    Runs in the child. A file reference is imported from its path (its folder put on
    `sys.path`); ``blocks`` left unset are found with `find_blocks`.

    Args:
        ref: ``builtin:NAME``, ``path/to/file.py:fn`` or ``pkg.module:fn``.
        device: the device to build on, passed to the builder.
        options: keyword arguments for the builder (e.g. ``{"batch_size": 8}``).

    Raises:
        WorkloadError: one line when the reference does not resolve, an option is unknown
            (or a flag's value not true or false), the import or the builder raised (the
            traceback is logged), or it returned something other than a `Workload`.
    """
    options = dict(options or {})
    parsed = _reference(ref)
    if parsed.kind == "hf":
        check_reference(ref)
        options["source"] = parsed.location
    fn = _resolve(ref, parsed)
    _check_options(ref, fn, options)
    try:
        if parsed.kind == "builtin" and device.type == "cpu":
            check_builtin_sizes(ref, fn, options)
        workload = fn(device, **options)
    except WorkloadError:
        raise  # already one line (the hf: builder's own checks)
    except Exception as exc:
        _log.error("workload %s raised", ref, exc_info=exc)
        raise WorkloadError(
            f"workload {ref} raised {one_line(exc, with_type=True)} "
            "(full traceback in the trial log)"
        ) from exc
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload {ref} returned {type(workload).__name__}, not a budgettune.Workload"
        )
    if workload.blocks is None:
        workload = dataclasses.replace(workload, blocks=find_blocks(workload.model))
    return workload
