"""`budgettune.search(...)`: the search from Python, the same study and pin as the CLI's.

    import budgettune
    from mymodels import build          # a Workload builder in an importable module or file

    pinned = budgettune.search(build, max_mem="20GB", num_trials=20, options={"batch_size": 8})
    model = pinned.compile(model)

Every study-file key is a typed keyword (``num_trials``, ``storage_url``, ``study_name``,
``margin``, ``space={...}``, ``fix={...}``, ``trial={...}``, ...), so a type checker catches a
misspelt one; the values are validated by the same schema as a study file
(`budgettune.study.study_schema`): a bad value raises `StudyFileError` in one line. Failures
raise the exceptions the CLI turns into exit codes (`UsageError`,
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

from budgettune.cli.app import STORAGE_ENV, default_device, files_read, quiet_background
from budgettune.cli.progress import SearchProgress
from budgettune.errors import UsageError, shown_value
from budgettune.integrations.trainer_workload import write_workload
from budgettune.pinning import PinnedConfig, check_pin_output, load_pinned, write_pin
from budgettune.study.run import run_search
from budgettune.study.spec import MAX_LIMIT_BYTES, MIN_LIMIT_BYTES, MemMetric, Sampler
from budgettune.study.study_file import build_search_spec, merge, read_study_file
from budgettune.study.study_schema import check_study_values
from budgettune.study.workers import gpu_groups, group_device
from budgettune.units import parse_bytes

Builder = Callable[..., Any]


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
    num_trials: int | None = None,
    storage_url: str | os.PathLike[str] | None = None,
    study_name: str | None = None,
    device: str | None = None,
    mem_metric: MemMetric | None = None,
    margin: float | None = None,
    max_host_mem: str | int | None = None,
    top_k: int | None = None,
    reverify_runs: int | None = None,
    trial_timeout_s: float | None = None,
    runs_dir: str | Path | None = None,
    compile_cache: bool | None = None,
    sampler: Sampler | None = None,
    sampler_seed: int | None = None,
    nproc_per_node: int | None = None,
    collective_timeout_s: float | None = None,
    global_batch: int | None = None,
    target: str | None = None,
    trials_per_gpu: int | None = None,
    space: Mapping[str, Any] | None = None,
    fix: Mapping[str, Any] | None = None,
    trial: Mapping[str, Any] | None = None,
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
        num_trials: trials to add to the study (its target grows by that many; 0 re-verifies
            and pins only).
        storage_url: the study's storage, an SQLAlchemy URL or an SQLite path (default
            ``./budgettune.db``; ``BUDGETTUNE_STORAGE`` when set).
        study_name: the study's name (default: made from the workload, device and limit).
        device: ``cpu``, ``cuda`` or ``cuda:N`` (default: the workload's own).
        mem_metric: the peak the limit holds: ``device`` (what nvidia-smi shows, the
            default), ``reserved`` or ``allocated``.
        margin: a configuration fits when its peak x (1 + margin) is within the limit (0.03).
        max_host_mem: the host memory offloading trials may use, e.g. ``"64GB"``.
        top_k: how many of the fastest that fit are re-measured (3).
        reverify_runs: at most this many rounds of fresh re-measurements (3).
        trial_timeout_s: seconds before a trial is killed.
        runs_dir: where trial logs and compile caches go.
        compile_cache: keep compile caches between trials (True).
        sampler: Optuna's ``tpe`` (the default) or ``gp`` (needs scipy).
        sampler_seed: the sampler's seed, for a reproducible search.
        nproc_per_node: ranks per trial: above 1, every trial is a sharded job (FSDP2).
        collective_timeout_s: seconds a rank's collective may wait in a sharded trial.
        global_batch: rows per optimizer step: each trial accumulates ``global_batch /
            micro_batch`` passes (with ``space={"micro_batches": [...]}`` the micro-batch is
            searched too; without a global batch, several micro-batches each step on their
            own rows and the search ranks samples per second).
        target: ``"torchtitan"``: keep the search to what torchtitan's job config expresses.
        trials_per_gpu: trials run at once on each GPU (their compiles overlap, their
            measurements take turns).
        space: the knobs searched, by their plural names: ``{"block_ac_every": [0, 1, 2]}``.
        fix: knobs held at one value, by their names: ``{"optimizer_impl": "fused"}``.
        trial: ``warmup_steps``, ``timed_steps``, ``seed`` of every trial.

    Returns:
        The pin, loaded as a training job loads it (`budgettune.load_pinned`).

    Raises:
        UsageError: a builder the trials cannot import, a bad key or value (`StudyFileError`),
            a bad limit, reference or device.
        NoFeasibleConfigError, NothingMeasuredError, StorageError, WorkerFailedError: as the
            CLI's exit codes 3, 4 and 1 say.
        KeyboardInterrupt: finished trials are kept; the running one runs again next time.
    """
    _check_arguments(
        max_mem, output, study_file, workload_dir, gpus, options, force=force, progress=progress
    )
    if isinstance(storage_url, os.PathLike):
        storage_url = os.fspath(storage_url)
    if storage_url is None:  # as every command reads it
        storage_url = os.environ.get(STORAGE_ENV) or None
    given: dict[str, Any] = {
        "num_trials": num_trials,
        "storage_url": storage_url,
        "study_name": study_name,
        "device": device,
        "mem_metric": mem_metric,
        "margin": margin,
        "max_host_mem": max_host_mem,
        "top_k": top_k,
        "reverify_runs": reverify_runs,
        "trial_timeout_s": trial_timeout_s,
        "runs_dir": None if runs_dir is None else _path("runs_dir", runs_dir),
        "compile_cache": compile_cache,
        "sampler": sampler,
        "sampler_seed": sampler_seed,
        "nproc_per_node": nproc_per_node,
        "collective_timeout_s": collective_timeout_s,
        "global_batch": global_batch,
        "target": target,
        "trials_per_gpu": trials_per_gpu,
        "space": _table("space", space),
        "fix": _table("fix", fix),
        "trial": _table("trial", trial),
    }
    settings: dict[str, Any] = {key: value for key, value in given.items() if value is not None}
    settings = check_study_values("budgettune.search()", settings)
    read = files_read(settings.get("storage_url"), study_file)
    check_pin_output(output, what="output", force=force, protected=read)  # before any write
    output = Path(output)  # (checked first: a trailing slash, which Path drops, names a folder)
    if _is_trainer(build):
        # the limit read before the workload folder is written (issue 48's P6-9)
        parse_bytes(max_mem, what="max_mem", min_bytes=MIN_LIMIT_BYTES, max_bytes=MAX_LIMIT_BYTES)
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
        raise UsageError(
            f"budgettune.search: gpus runs on GPUs; drop device={shown_value(values['device'])}"
        )
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


def _path(name: str, value: object) -> str:
    """A path keyword as text, or one line when it is not a path (issue 48's P6-9)."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value).strip():
        raise UsageError(f"budgettune.search: {name} takes a path; got {shown_value(value)}")
    return str(os.fspath(value))


def _table(name: str, value: object) -> dict[str, Any] | None:
    """A table keyword (``space``, ``fix``, ``trial``) as a dict, or one line when it is not a
    mapping (issue 48's P6-8: ``space=[1]`` was a raw TypeError)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise UsageError(
            f"budgettune.search: {name} takes a mapping, e.g. {name}={{...}}; "
            f"got {shown_value(value)}"
        )
    return dict(value)


def _check_arguments(
    max_mem: object,
    output: object,
    study_file: object,
    workload_dir: object,
    gpus: object,
    options: object,
    *,
    force: object,
    progress: object,
) -> None:
    """The arguments a type checker would refuse, refused at run time too, in one line each,
    before anything is written (issue 48: ``output=123`` was a TypeError from deep inside,
    ``force='yes'`` taken as true, an option of no JSON type made a study first)."""
    if (
        isinstance(gpus, (str, bytes))
        or not isinstance(gpus, Sequence)
        or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)
    ):
        raise UsageError(
            f"budgettune.search: gpus takes GPU indices, e.g. [0, 1]; got {shown_value(gpus)}"
        )
    if options is not None and not isinstance(options, Mapping):
        raise UsageError(
            f"budgettune.search: options takes a mapping of builder options, e.g. "
            f"{{'batch_size': 8}}; got {shown_value(options)}"
        )
    if options:  # by the study file's schema
        check_study_values("budgettune.search()", {"workload_options": dict(options)})
    if isinstance(max_mem, bool) or not isinstance(max_mem, (str, int)):
        raise UsageError(
            f"budgettune.search: max_mem takes '20GB' or bytes; got {shown_value(max_mem)}"
        )
    for name, value, optional in (
        ("output", output, False),
        ("study_file", study_file, True),
        ("workload_dir", workload_dir, False),
    ):
        if value is None and optional:
            continue
        if (
            not isinstance(value, (str, os.PathLike))
            or "\0" in os.fspath(value)
            or not os.fspath(value).strip()  # "" would be the current folder (P6-9)
        ):
            raise UsageError(f"budgettune.search: {name} takes a path; got {shown_value(value)}")
    for name, value in (("force", force), ("progress", progress)):
        if not isinstance(value, bool):
            raise UsageError(
                f"budgettune.search: {name} takes True or False; got {shown_value(value)}"
            )


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
