"""The trial child's process environment, set before torch is imported: the allocator setting
and the compile caches (one folder per partition variant, or none)."""

from __future__ import annotations

import os
import tempfile

from budgettune.trial.allocator import apply_allocator_settings
from budgettune.trial.trial_run import TrialRun

CACHES_OFF_ENV = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
"""What turns inductor's FX-graph and AOTAutograd caches off: read when torch is imported."""


def import_time_env(run: TrialRun) -> dict[str, str]:
    """What `prepare_process_environment` sets that torch reads when it is imported (a trial
    server must be started with it: `budgettune.trial.servers`)."""
    return dict(CACHES_OFF_ENV) if run.cache_dir() is None else {}


def prepare_process_environment(run: TrialRun) -> bool:
    """Set the environment a trial child needs; call before torch is imported.

    ``PYTORCH_CUDA_ALLOC_CONF`` is read once, when CUDA initialises. The compile caches are
    either off (``run.cache_dir()`` is None: FX-graph and AOTAutograd caches disabled, a fresh
    temporary inductor cache) or pointed at the directory of this spec's partition variant,
    because AOTAutograd's cache key does not cover the solver, the estimator or a patched op
    list (measured on torch 2.13) and a shared cache would serve a stale partition. Triton's
    cache (compiled kernels and launcher stubs, keyed by their source and target) is safe to
    share, so every variant of the cache root uses one: a trial of a new variant then compiles
    only the kernels no earlier trial had.

    Args:
        run: the trial to launch.

    Returns:
        Whether the compile caches start empty (inductor's folder for this variant has
        nothing yet, or the caches are off): a cold start, as on a fresh host.
    """
    spec = run.spec
    apply_allocator_settings(spec.cuda_alloc_conf)  # torch is not imported yet: the variable
    cache_dir = run.cache_dir()
    if cache_dir is None or run.cache_root is None:
        os.environ.update(CACHES_OFF_ENV)
        cache_dir = tempfile.mkdtemp(prefix="budgettune-inductor-")
        triton_dir = os.path.join(cache_dir, "triton")
    else:
        os.makedirs(cache_dir, exist_ok=True)
        triton_dir = os.path.join(run.cache_root, "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    os.environ["TRITON_CACHE_DIR"] = triton_dir
    return not os.listdir(cache_dir)
