"""Make ``budgettune-rev0001.db``: a SQLite storage at our schema revision 0001 with two rows.

Run from the repository root: ``python tests/data/make_rev0001_db.py``. The upgrade test copies
the committed file and checks that `budgettune db upgrade` keeps these rows.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

import optuna
from sqlalchemy import text

from budgettune.storage import engine as storage_engine
from budgettune.storage import migrations

TARGET = Path(__file__).with_name("budgettune-rev0001.db")
STUDY = "old-study"
SPEC = {"activation_memory_budget": 0.5, "compile_backend": "aot_eager_decomp_partition"}


def main() -> None:
    TARGET.unlink(missing_ok=True)
    url = f"sqlite:///{TARGET}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=STUDY, storage=url, directions=["minimize"])
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, values=[1.0]))
    engine = storage_engine.create_engine(url)
    with engine.begin() as connection:
        migrations.upgrade_connection(connection, "0001")
        now = "2026-11-21 12:00:00.000000"
        connection.execute(
            text(
                "INSERT INTO bt_workloads (digest, ref, options_json, param_count, param_bytes,"
                " batch_json, created_at) VALUES ('d1', 'builtin:tiny-gpt', '{}', 1000, 4000,"
                " :batch, :now)"
            ),
            {"batch": json.dumps(["float32[4, 64]"]), "now": now},
        )
        connection.execute(
            text(
                "INSERT INTO bt_measurements (study_name, trial_number, kind, workload_digest,"
                " spec_json, outcome, peak_allocated_bytes, peak_reserved_bytes,"
                " peak_device_bytes, steady_bytes, peak_phase, step_time_ms, step_time_p10_ms,"
                " step_time_p90_ms, compile_s, loss, grad_norm, error, device_name,"
                " torch_version, log_path, wall_s, created_at) VALUES (:study, 0, 'trial', 'd1',"
                " :spec, 'ok', 100, 200, 300, 50, 'backward', 12.5, 12.0, 13.0, 3.0, 2.25, 0.5,"
                " '', 'cpu', '2.13.0', '/logs/t0.log', 4.0, :now)"
            ),
            {"study": STUDY, "spec": json.dumps(SPEC), "now": now},
        )
        connection.execute(
            text(
                "INSERT INTO bt_measurements (study_name, trial_number, kind, workload_digest,"
                " spec_json, outcome, error, device_name, torch_version, log_path, wall_s,"
                " created_at) VALUES (:study, 1, 'trial', 'd1', '{}', 'crashed',"
                " 'device-side assert', 'cpu', '2.13.0', '/logs/t1.log', 1.5, :now)"
            ),
            {"study": STUDY, "now": now},
        )
    engine.dispose()
    # leave one self-contained file (no -wal / -shm beside it)
    with contextlib.closing(sqlite3.connect(TARGET)) as connection:
        connection.execute("PRAGMA journal_mode = DELETE")
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
