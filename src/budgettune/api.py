"""`budgettune.search(...)`: the search from Python, the same study and pin as the CLI's.

    import budgettune
    from mymodels import build          # a Workload builder in an importable module or file

    pinned = budgettune.search(build, max_mem="20GB", num_trials=20, options={"batch_size": 8})
    model = pinned.compile(model)

Every study-file key is a keyword (``num_trials``, ``storage_url``, ``study_name``,
``margin``, ``space={...}``, ``fix={...}``, ``trial={...}``, ...; the spellings before issue 31,
``trials``, ``storage``, ``study``, are read too), validated by the same schema as a study
file (`budgettune.search.study_schema`): an unknown key or a bad value raises `StudyFileError`
in one line. Failures raise the exceptions the CLI turns into exit codes (`UsageError`,
`NoFeasibleConfigError`, `NothingMeasuredError`, `StorageError`, ...; all `BudgettuneError`).
Trials run in their own processes, as in the CLI: the builder is passed to them by reference,
so it must be importable by a fresh Python (a module or a ``.py`` file, not a notebook cell).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna

from budgettune.cli.app import default_device, files_read, quiet_background
from budgettune.cli.progress import SearchProgress
from budgettune.errors import UsageError
from budgettune.integrations.trainer_workload import write_workload
from budgettune.pinning import PinnedConfig, check_pin_output, load_pinned, write_pin
from budgettune.search.run import run_search
from budgettune.search.study_file import build_search_spec, merge, read_study_file
from budgettune.search.study_schema import check_study_values
from budgettune.search.workers import gpu_groups, group_device

Builder = Callable[..., Any]

_NOT_STUDY_KEYS = ("workload", "workload_options", "max_mem")
"""Study-file keys that `search` takes as its own arguments."""


def search(
    build: Builder | str,
    max_mem: str | int,
    *,
    options: Mapping[str, Any] | None = None,
    study_file: str | Path | None = None,
    output: str | Path = "budgettune-pin.json",
    gpus: Sequence[int] = (),
    progress: bool = True,
    workload_dir: str | Path = "budgettune-workload",
    force: bool = False,
    **settings: Any,
) -> PinnedConfig:
    """Search the recompute knobs under ``max_mem``, re-verify the best, write and return the pin.

    Calling it again with the same arguments resumes the same study (``num_trials`` more
    trials; ``num_trials=0`` only re-verifies and pins), as re-running ``budgettune search``
    does.

    Args:
        build: the workload builder, a function defined at the top level of an importable
            module or a ``.py`` file (passed to the trials as ``module:fn`` or
            ``path/file.py:fn``), or a reference string (``builtin:tiny-gpt``,
            ``hf:meta-llama/Llama-3.2-1B``, ``pkg.module:fn``), or a transformers
            ``Trainer``: its model (by config) and first batch are written to
            ``workload_dir`` as a builder (`budgettune.integrations.write_workload`).
        max_mem: the memory limit, ``"20GB"``, ``"18.5GiB"`` or bytes.
        options: the builder's keyword options (``--option`` on the CLI).
        study_file: a TOML study file; keywords override it, as flags do.
        output: where the pinned config JSON is written.
        gpus: run one worker process per GPU index of this host (``--gpus``).
        workload_dir: where a ``Trainer``'s workload is written.
        force: replace an ``output`` file that is not a pin budgettune wrote (never the
            study's database, its study file, a folder or a special file).
        progress: show the progress bar and one line per trial on stderr (rich; in a notebook
            it renders in the cell's output).
        **settings: any study-file key (``num_trials``, ``storage_url``, ``study_name``,
            ``device``, ``mem_metric``, ``margin``, ``top_k``, ``reverify_runs``,
            ``trial_timeout_s``, ``sampler_seed``, ``nproc_per_node``, ``space``, ``fix``,
            ``trial``, ...).

    Returns:
        The pin, loaded as a training job loads it (`budgettune.load_pinned`).

    Raises:
        UsageError: a builder the trials cannot import, a bad key or value (`StudyFileError`),
            a bad limit, reference or device.
        NoFeasibleConfigError, NothingMeasuredError, StorageError, WorkerFailedError: as the
            CLI's exit codes 3, 4 and 1 say.
        KeyboardInterrupt: finished trials are kept; the running one runs again next time.
    """
    if (
        isinstance(gpus, (str, bytes))
        or not isinstance(gpus, Sequence)
        or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)
    ):
        raise UsageError(f"budgettune.search: gpus takes GPU indices, e.g. [0, 1]; got {gpus!r}")
    if options is not None and not isinstance(options, Mapping):
        raise UsageError(
            f"budgettune.search: options takes a mapping of builder options, e.g. "
            f"{{'batch_size': 8}}; got {options!r:.80}"
        )
    taken = sorted(set(settings) & set(_NOT_STUDY_KEYS))
    if taken:
        raise UsageError(f"budgettune.search: pass {taken[0]!r} as its own argument")
    settings = check_study_values("budgettune.search()", settings)  # today's key names
    output = Path(output)
    read = files_read(settings.get("storage_url"), study_file)
    check_pin_output(output, what="output", force=force, protected=read)  # before any write
    if _is_trainer(build):
        build = write_workload(build, workload_dir)
    reference, import_root = builder_reference(build)
    file_values = read_study_file(study_file) if study_file is not None else {}
    values = merge(
        file_values,
        {
            "workload": reference,
            "workload_options": dict(options) if options else None,
            "max_mem": max_mem,
            **settings,
        },
    )
    gpu_list = [int(g) for g in gpus]
    if gpu_list and not str(values.get("device", "cuda")).startswith("cuda"):
        raise UsageError(f"budgettune.search: gpus runs on GPUs; drop device={values['device']!r}")
    if gpu_list and "device" not in values:
        values["device"] = group_device(gpu_groups(gpu_list, values.get("nproc_per_node", 1))[0])
    spec = build_search_spec(values, default_device=default_device(values["workload"]))
    read = files_read(spec.storage_url, study_file)  # a study file's storage too
    check_pin_output(output, what="output", force=force, protected=read)
    with _importable_by_trials(import_root), _quiet_background():
        if progress:
            with SearchProgress() as shown:
                outcome = run_search(spec, shown, gpus=gpu_list)  # type: ignore[arg-type]
        else:
            outcome = run_search(spec, None, gpus=gpu_list)
    write_pin(output, outcome.pin)
    return load_pinned(output)


def builder_reference(build: Builder | str) -> tuple[str, str | None]:
    """The workload reference a trial's fresh process resolves ``build`` by, and the folder
    its module must be imported from (None: importable as it is).

    Raises:
        UsageError: ``build`` is not a top-level function of a module or file a fresh Python
            can import (a notebook cell, a lambda, a function inside a function).
    """
    if isinstance(build, str):
        return build, None
    name = getattr(build, "__qualname__", None)
    module_name = getattr(build, "__module__", None)
    if not callable(build) or not name or not module_name:
        raise UsageError(
            f"budgettune.search: build must be a workload builder function or a reference "
            f"string, got {type(build).__name__}"
        )
    if "<" in name or "." in name:
        raise UsageError(
            f"budgettune.search: builder {name!r} is not a top-level function; trials run in "
            "their own processes and import it: define it at the top level of a .py file"
        )
    module = sys.modules.get(module_name)
    source = _module_file(module)
    if source is None or (module_name == "__main__" and getattr(module, name, None) is not build):
        # a notebook's cells run in a __main__ with no file (or not the kernel's own file)
        raise UsageError(
            f"budgettune.search: builder {name!r} is defined in a notebook cell or an "
            "interactive session; trials run in their own processes and import it: put it in "
            f"a .py file (e.g. my_workload.py) and pass it imported from there, or "
            f"'my_workload.py:{name}'"
        )
    if getattr(module, name, None) is not build:
        raise UsageError(
            f"budgettune.search: {module_name}.{name} is not this builder (redefined or "
            "decorated); pass a function the module defines under its own name"
        )
    if module_name == "__main__":
        return f"{source}:{name}", None
    # the folder the top-level package lies in, for a module imported through a sys.path
    # entry a fresh process would not have (a script's own folder, a notebook's chdir)
    root = Path(source)
    for _ in module_name.split("."):
        root = root.parent
    if Path(source).name == "__init__.py":
        root = root.parent
    return f"{module_name}:{name}", str(root)


def _is_trainer(build: object) -> bool:
    """A transformers ``Trainer`` (by what `write_workload` uses, without importing it)."""
    return hasattr(build, "get_train_dataloader") and hasattr(build, "model")


def _module_file(module: Any) -> str | None:
    path = getattr(module, "__file__", None)
    if not path or path.startswith("<"):
        return None
    try:
        source = inspect.getsourcefile(module)
    except TypeError:
        return None
    return str(Path(source).resolve()) if source and Path(source).is_file() else None


@contextlib.contextmanager
def _importable_by_trials(root: str | None) -> Iterator[None]:
    """Trials inherit this process's environment: put the builder's import root on their
    ``PYTHONPATH`` for the search, and restore it after."""
    if root is None:
        yield
        return
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, before) if p)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


@contextlib.contextmanager
def _quiet_background() -> Iterator[None]:
    """The CLI's quiet logging (`cli.app.quiet_background`), undone when the search ends: a
    library call must not leave Optuna's verbosity or the thread excepthook changed."""
    verbosity, hook = optuna.logging.get_verbosity(), threading.excepthook
    quiet_background()
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)
        threading.excepthook = hook
