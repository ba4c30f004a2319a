"""The parent/child contract: `TrialOutcome`, `Measurement`, `TrialResult`, JSON in and out.

The child writes ``RESULT.json`` atomically (`write_result_atomically`); the parent reads it
(`read_result`). A missing or unreadable result file is a crash, decided by the launcher.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

from budgettune.errors import SpecError
from budgettune.trial.phases import check_phases

PHASES = ("forward", "backward", "optimizer")
MEM_METRICS = ("device", "reserved", "allocated")


class TrialOutcome(str, enum.Enum):
    """How a trial ended."""

    OK = "ok"
    OOM = "oom"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    NUMERICS_MISMATCH = "numerics_mismatch"
    NON_FINITE = "non_finite"
    """The first step's loss or gradient norm was NaN or infinite: the child stops there, so
    the trial has no figures, and nothing it would measure could be pinned."""

    def is_feasible(self) -> bool:
        """Whether a config with this outcome may be pinned (still subject to the limit)."""
        return self is TrialOutcome.OK

    def is_measured(self) -> bool:
        """Whether the trial produced memory and time figures."""
        return self in (TrialOutcome.OK, TrialOutcome.NUMERICS_MISMATCH)

    def is_infeasible_result(self) -> bool:
        """Whether Optuna should record the trial as complete-and-infeasible (not failed).

        OOM teaches the sampler where the memory boundary is; a numerics mismatch is a real,
        measured point that must never be pinned; a non-finite loss marks a region whose
        numerics break. Crashes and timeouts are failures.
        """
        return self in (
            TrialOutcome.OOM,
            TrialOutcome.NUMERICS_MISMATCH,
            TrialOutcome.NON_FINITE,
        )

    def ran(self) -> bool:
        """Whether the configuration ran without crashing or hanging (crash memory blames a
        knob value only when no trial that ran had it)."""
        return self not in (TrialOutcome.CRASHED, TrialOutcome.TIMEOUT)

    def tells_fit(self) -> bool:
        """Whether the trial says if its configuration fits: it was measured, or it ran out of
        memory. A study with no such trial measured nothing (exit 4, not 3): every trial
        crashed, timed out or had a non-finite loss."""
        return self.is_measured() or self is TrialOutcome.OOM


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    """Figures of one measured trial (all memory figures are absolute bytes)."""

    peak_allocated_bytes: int
    """CUDA: `max_memory_allocated` over the measured step. CPU: the profiler's absolute peak."""
    peak_reserved_bytes: int
    """CUDA: `max_memory_reserved`. CPU: equal to the allocated peak."""
    peak_device_bytes: int
    """CUDA: what nvidia-smi would show at the peak (reserved peak + context + non-PyTorch).
    CPU: equal to the allocated peak."""
    steady_bytes: int
    """Bytes allocated before the step: parameters + gradients + optimizer state (+ batch)."""
    phase_peak_bytes: Mapping[str, int]
    """Allocated peak of each phase (``forward``, ``backward``, ``optimizer``), absolute."""
    peak_phase: str
    """The phase whose peak is the step's peak."""
    step_time_ms: float
    """Median wall time of the timed steps."""
    step_time_p10_ms: float
    """10th percentile of the timed steps."""
    step_time_p90_ms: float
    """90th percentile of the timed steps."""
    compile_s: float
    """Wall time of the first warm-up step (compilation happens there)."""
    loss: float
    """Loss of the first step under the spec's seed."""
    grad_norm: float
    """Global L2 norm of the gradients of the first step."""
    host_peak_bytes: int = 0
    """Host memory held for offloaded activations, at most, over the measured step (0 without
    offload): on CUDA the pinned allocator's own bytes where torch reports them (it rounds
    blocks up and keeps them cached), else the offloaded bytes held at once."""
    offload_bytes: int = 0
    """Bytes the measured step copied to host memory (as many come back in its backward)."""
    forward_backward_ms: float | None = None
    """Median forward+backward pass of an accumulating step (``accum_steps`` > 1), timed
    apart from the optimizer step (None: the step is one pass, timed whole)."""
    optimizer_ms: float | None = None
    """Median optimizer step of an accumulating step (None: timed with its pass)."""
    samples_per_step: int = 0
    """Rows one optimizer step takes: the batch's rows x ``accum_steps`` (0: not known)."""
    tokens_per_step: int = 0
    """Tokens one optimizer step takes, for a batch of token ids (rows x sequence) x
    ``accum_steps`` (0: not a language model's batch)."""

    @property
    def samples_per_s(self) -> float | None:
        """Samples per second at the median step time (None when the rows are not known)."""
        if not self.samples_per_step or self.step_time_ms <= 0:
            return None
        return self.samples_per_step * 1e3 / self.step_time_ms

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second at the median step time (None: not a batch of token ids)."""
        if not self.tokens_per_step or self.step_time_ms <= 0:
            return None
        return self.tokens_per_step * 1e3 / self.step_time_ms

    def __post_init__(self) -> None:
        if self.peak_phase not in PHASES:
            raise SpecError(f"peak_phase must be one of {PHASES}, got {self.peak_phase!r}")
        object.__setattr__(self, "phase_peak_bytes", dict(self.phase_peak_bytes))

    def peak_bytes(self, metric: str) -> int:
        """The peak on one of the memory metrics: ``device``, ``reserved`` or ``allocated``."""
        if metric not in MEM_METRICS:
            raise SpecError(f"unknown memory metric {metric!r}; choose one of {MEM_METRICS}")
        return int(getattr(self, f"peak_{metric}_bytes"))

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form."""
        data = dataclasses.asdict(self)
        data["phase_peak_bytes"] = dict(self.phase_peak_bytes)
        return data

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """Build from the JSON form."""
        return cls(**dict(data))


@dataclass(frozen=True, kw_only=True, slots=True)
class RankFigures:
    """One rank of a sharded trial: how it ended and, when measured, its own figures."""

    rank: int
    """The global rank."""
    outcome: TrialOutcome
    """How this rank ended (``crashed`` with ``terminated`` stage: stopped after another's
    failure)."""
    measurement: Measurement | None = None
    """This rank's figures, when it measured."""
    error: str = ""
    """One line when it did not end ``ok``."""

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form."""
        m = self.measurement
        return {
            "rank": self.rank,
            "outcome": TrialOutcome(self.outcome).value,
            "measurement": None if m is None else m.to_json_dict(),
            "error": self.error,
        }

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> RankFigures:
        """Build from the JSON form."""
        m = data.get("measurement")
        return cls(
            rank=int(data["rank"]),
            outcome=TrialOutcome(data["outcome"]),
            measurement=None if m is None else Measurement.from_json_dict(m),
            error=str(data.get("error", "")),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialResult:
    """What one trial produced: the outcome, the figures if measured, and where its log is."""

    outcome: TrialOutcome
    """How the trial ended."""
    measurement: Measurement | None = None
    """Figures, present when ``outcome.is_measured()``."""
    error: str = ""
    """One line saying what went wrong (empty when ok)."""
    device_name: str = ""
    """e.g. ``NVIDIA H200`` or ``cpu``."""
    torch_version: str = ""
    """`torch.__version__` in the child."""
    cuda_version: str = ""
    """`torch.version.cuda` in the child (empty on CPU builds)."""
    log_path: str = ""
    """The per-trial log file (stdout and stderr of the child)."""
    wall_s: float = 0.0
    """Wall time of the whole child process as seen by the parent."""
    workload_fingerprint: Mapping[str, Any] | None = None
    """`workload.WorkloadFingerprint.to_json_dict()` of the workload the child built."""
    failed_stage: str = ""
    """``workload`` when the workload itself could not be imported, built or validated (before
    any knob was applied: every configuration would fail alike); ``collective`` when a rank's
    collective failed because another rank went away; ``terminated`` when the launcher stopped
    the rank after another's failure; ``died`` when a rank's process died without writing its
    result (its supervisor wrote it); else empty."""
    model_changes: tuple[str, ...] = ()
    """What the trial changed in the model besides the knobs, e.g. ``use_cache=False`` on a
    `transformers` model under block AC (a training job's `pinned.compile` does the same)."""
    world_size: int = 1
    """Ranks of the trial (above 1: a sharded trial under ``torch.distributed.run``)."""
    failed_rank: int | None = None
    """The rank whose failure ended a sharded trial (None: ok, or not known)."""
    failed_at_s: float = 0.0
    """Unix time a rank's failure was caught, before its process group was torn down: of the
    ranks of a sharded trial that failed, the first one is the cause (the others' collectives
    broke after it). 0 when ok."""
    ranks: tuple[RankFigures, ...] = ()
    """Every rank's outcome and figures (sharded trials); the `measurement` is their merge:
    the largest peaks and the slowest step time."""
    cold_caches: bool = False
    """The process started with empty compile caches, as a job on a fresh host does (a
    cold start can reserve more memory: autotuning and the first-run state of inductor's
    cache folder)."""
    dropout: tuple[str, ...] | None = None
    """The dropout the measured model drew (`trial.dropout.active_dropout`; empty: none;
    None: not recorded)."""
    phases_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Seconds of each phase of the process (`budgettune.trial.phases.PHASES`: start, imports,
    CUDA init, build, prepare, compile, warm-up, GPU wait, measure, result, exit), as far as
    it got; they add up to ``wall_s``. A sharded trial's are each phase's slowest rank."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", TrialOutcome(self.outcome))
        object.__setattr__(self, "model_changes", tuple(self.model_changes))
        if self.dropout is not None:
            object.__setattr__(self, "dropout", tuple(self.dropout))
        object.__setattr__(self, "ranks", tuple(self.ranks))
        object.__setattr__(self, "phases_s", check_phases(self.phases_s))
        if self.outcome.is_measured() and self.measurement is None:
            raise SpecError(f"a {self.outcome.value} result needs a measurement")

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form (what ``budgettune trial --json`` prints)."""
        return {
            "outcome": self.outcome.value,
            "measurement": None if self.measurement is None else self.measurement.to_json_dict(),
            "error": self.error,
            "device_name": self.device_name,
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "log_path": self.log_path,
            "wall_s": self.wall_s,
            "workload_fingerprint": (
                None if self.workload_fingerprint is None else dict(self.workload_fingerprint)
            ),
            "failed_stage": self.failed_stage,
            "model_changes": list(self.model_changes),
            "world_size": self.world_size,
            "failed_rank": self.failed_rank,
            "failed_at_s": self.failed_at_s,
            "ranks": [r.to_json_dict() for r in self.ranks],
            "cold_caches": self.cold_caches,
            "dropout": None if self.dropout is None else list(self.dropout),
            "phases_s": dict(self.phases_s),
        }

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> TrialResult:
        """Build from the JSON form."""
        values = dict(data)
        if values.get("measurement") is not None:
            values["measurement"] = Measurement.from_json_dict(values["measurement"])
        values["outcome"] = TrialOutcome(values["outcome"])
        values["ranks"] = tuple(RankFigures.from_json_dict(r) for r in values.get("ranks", ()))
        values["phases_s"] = dict(values.get("phases_s") or {})
        return cls(**values)

    def replace(self, **changes: Any) -> TrialResult:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


def _file_mode(target: Path) -> int:
    """The mode a newly written file gets: the replaced file's, else 0666 less the umask, as
    ``open`` would give it (issue 48: pins came out 0600 whatever the umask, unreadable to a
    team that shares them). The umask is read from /proc (``os.umask`` would change it for
    every thread while it is read), 022 where that is not there."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        pass
    umask = 0o022
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                umask = int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o666 & ~umask


def _remove_orphans(target: Path) -> None:
    """Remove the temp files an earlier writer of ``target`` left when it was killed mid-write
    (issue 48: kill -9 during a pin's write left ``.pin.json.XXXX``): those named after a
    process that no longer runs. (A temp file's name carries its writer's pid.)"""
    try:
        siblings = list(target.parent.glob(f".{glob_escape(target.name)}.*.*"))
    except OSError:
        return
    for sibling in siblings:
        pid_text = sibling.name[len(target.name) + 2 :].split(".", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            sibling.unlink(missing_ok=True)  # its writer is gone
        except (PermissionError, OverflowError, OSError):
            continue  # alive (another user's), or not a pid


def write_json_atomically(path: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    """Write JSON to a temp file in the same folder, fsync, then rename over ``path`` (the
    file keeps the mode the replaced one had, else the umask's)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = _file_mode(target)
    _remove_orphans(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.replace(tmp, target)
        except IsADirectoryError as exc:  # named as the file it was for, not the temp (P6-16)
            raise IsADirectoryError(exc.errno, exc.strerror, str(target)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_result_atomically(path: str | os.PathLike[str], result: TrialResult) -> None:
    """Write ``RESULT.json`` so a reader never sees a half-written file."""
    write_json_atomically(path, result.to_json_dict())


def read_result(path: str | os.PathLike[str]) -> TrialResult:
    """Read ``RESULT.json``.

    Raises:
        OSError: when the file is missing.
        ValueError: when it is not a valid result (json.JSONDecodeError is a ValueError).
    """
    with open(path) as handle:
        data = json.load(handle)
    try:
        return TrialResult.from_json_dict(data)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a TrialResult: {exc}") from exc


def death_message(returncode: int, *, who: str) -> str:
    """Why a child process left no result: the signal that killed it, or its exit code."""
    import signal

    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{who} killed by {name} without writing a result"
    return f"{who} exited with code {returncode} without writing a result"
