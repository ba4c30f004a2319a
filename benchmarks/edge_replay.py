"""Would the memory edge have started in a stored study? Its choice replayed trial by trial.

    python -m benchmarks.edge_replay sqlite:///benchmarks/results/h200-tuner-2026-11-25/tuner.db \\
        tuner-L1-open30 tuner-L3-m0-open30

For each study, as its own search spec stored it (with a target of 20 trials, where the edge
runs), the trials in the order they started, each taken as measured: after each one, the
(policy, stride) pairs whose budget the edge would lower (`budgettune.study.edge`), or ``-``.
A study whose every line says ``-`` would have run without the edge, as it did: a search
with the edge measures what it measured (issue 30's "show why the change cannot affect them";
the trials after the opening are sampled, so a search again is not the same search).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import optuna

from benchmarks.common import kept_storage, script_main
from budgettune.errors import BudgettuneError
from budgettune.storage.coordination import database_errors
from budgettune.storage.user_attrs import SPEC_ATTR
from budgettune.study.edge import EDGE_MIN_TRIALS, edge_strides
from budgettune.study.opening_plan import held, points_of, sampling_space
from budgettune.study.spec import SearchSpec
from budgettune.study.structured import by_spec_of
from budgettune.study.study import as_given


def replay(study: optuna.Study) -> list[str]:
    """One line per trial: its label, state, peak and time, then the edge's pairs so far."""
    attrs = study.user_attrs
    if SPEC_ATTR not in attrs:
        raise BudgettuneError(f"study {study.study_name!r} holds no search spec")
    search = SearchSpec.from_json_dict(attrs[SPEC_ATTR])
    search = search.replace(num_trials=max(search.num_trials, EDGE_MIN_TRIALS))
    base = as_given(search).replace(**held(attrs))
    policies = sampling_space(search, attrs).block_ac_policies
    trials = study.get_trials(deepcopy=False)
    lines = [
        f"{study.study_name}: limit {search.max_mem_bytes / 1e9:.3f} GB, held {held(attrs)}, "
        f"policies {list(policies)}, strides {list(search.space.block_ac_every)}"
    ]
    for n, trial in enumerate(trials, start=1):
        points = points_of(trials[:n], search.mem_metric)
        pairs = edge_strides(search, points, by_spec_of(points), base, policies)
        peak = trial.user_attrs.get("peak_device_bytes") or 0
        ms = trial.user_attrs.get("step_time_ms") or 0.0
        label = trial.user_attrs.get("baseline") or "sampled"
        edge = ", ".join(f"{p}-{s}" for p, s in pairs) or "-"
        lines.append(
            f"  {trial.number:>2} {label:<24} {trial.state.name:<8} {peak / 1e9:6.2f} GB "
            f"{ms:6.1f} ms  edge: {edge}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("storage", help="the studies' database URL")
    parser.add_argument("studies", nargs="+", help="study names")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    # read-only, as `benchmarks.common.study_trials`: a mistyped SQLite path is not created
    with kept_storage(args.storage) as store, database_errors(store.url):
        for name in args.studies:
            try:
                study = optuna.load_study(study_name=name, storage=store.optuna_storage)
            except KeyError as exc:
                raise BudgettuneError(f"no study {name!r} in {store.display_url}") from exc
            print("\n".join(replay(study)))
    return 0


if __name__ == "__main__":
    script_main(main)
