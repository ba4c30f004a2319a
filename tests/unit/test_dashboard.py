"""`budgettune.present.dashboard`: optuna-dashboard read-only unless asked, and our views in it.

Real SQLite files in tmp_path, the real optuna-dashboard WSGI app called directly, and once
through a real threaded server on a free port.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

import optuna
import optuna_dashboard
import pytest

from budgettune.errors import StorageError, StudyNotFoundError, UsageError
from budgettune.present import dashboard
from budgettune.present.dashboard_views import PLOT_ID
from budgettune.storage import open_storage
from budgettune.study.publish import publish_views
from fixtures.dashboard_study import LIMIT_BYTES, PIN_TRIAL, SampleStudy, make_study


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> SampleStudy:
    return make_study(tmp_path_factory.mktemp("template") / "budgettune.db")


@pytest.fixture
def sample(template: SampleStudy, tmp_path: Path) -> SampleStudy:
    """A fresh copy of the sample study's SQLite file (WAL and all) for each test."""
    source = Path(template.url)
    for path in source.parent.glob(source.name + "*"):
        shutil.copyfile(path, tmp_path / path.name)
    return dataclasses.replace(template, url=str(tmp_path / source.name))


@pytest.fixture
def read_only(sample: SampleStudy) -> Iterator[dashboard.DashboardApp]:
    app = dashboard.make_app(sample.url, allow_writes=False)
    yield app
    app.close()


def call(app: Any, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], bytes]:
    """One request straight into a WSGI app: status code, headers, body."""
    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    data = b"" if body is None else json.dumps(body).encode()
    environ.update(
        REQUEST_METHOD=method,
        PATH_INFO=path,
        QUERY_STRING="",
        CONTENT_TYPE="application/json",
        CONTENT_LENGTH=str(len(data)),
    )
    environ["wsgi.input"] = io.BytesIO(data)
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen["status"], seen["headers"] = status, dict(headers)
        return lambda _data: None

    chunks = app(environ, start_response)
    try:
        payload = b"".join(chunks)
    finally:
        if hasattr(chunks, "close"):
            chunks.close()
    return int(seen["status"].split()[0]), seen["headers"], payload


def snapshot(url: str) -> list[Any]:
    """Everything a write could change: studies, their attrs, every trial."""
    with open_storage(url, create=False) as store:
        rdb = store.optuna_storage
        state = []
        for study in rdb.get_all_studies():
            study_id = rdb.get_study_id_from_name(study.study_name)
            trials = [
                (t.number, t.state, t.values, t.user_attrs, t.system_attrs)
                for t in rdb.get_all_trials(study_id)
            ]
            state.append(
                (
                    study.study_name,
                    rdb.get_study_user_attrs(study_id),
                    rdb.get_study_system_attrs(study_id),
                    trials,
                )
            )
        return state


def trial_id(sample: SampleStudy, number: int) -> int:
    with open_storage(sample.url, create=False) as store:
        return store.optuna_storage.get_trial_id_from_study_id_trial_number(
            sample.study_id, number
        )


# ------------------------------------------------------------------------------ read-only


def test_reads_work_when_read_only(read_only: dashboard.DashboardApp, sample: SampleStudy) -> None:
    status, _, body = call(read_only, "GET", "/api/studies")
    assert status == 200
    assert [s["study_name"] for s in json.loads(body)["study_summaries"]] == [sample.study_name]

    status, _, body = call(read_only, "GET", f"/api/studies/{sample.study_id}")
    assert status == 200
    assert len(json.loads(body)["trials"]) == 8
    assert call(read_only, "HEAD", "/api/studies")[0] == 200
    assert call(read_only, "GET", "/dashboard")[0] == 200


def test_delete_study_is_refused_and_the_study_stays(
    read_only: dashboard.DashboardApp, sample: SampleStudy
) -> None:
    before = snapshot(sample.url)
    status, headers, body = call(read_only, "DELETE", f"/api/studies/{sample.study_id}")
    assert status == 403
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"reason": dashboard.READ_ONLY_REASON}
    assert "--allow-writes" in dashboard.READ_ONLY_REASON
    assert call(read_only, "GET", f"/api/studies/{sample.study_id}")[0] == 200
    assert snapshot(sample.url) == before


def test_tell_and_note_edits_are_refused(
    read_only: dashboard.DashboardApp, sample: SampleStudy
) -> None:
    before = snapshot(sample.url)
    tid = trial_id(sample, 0)
    requests = [
        ("POST", f"/api/trials/{tid}/tell", {"state": "Fail"}),
        ("POST", f"/api/trials/{tid}/user-attrs", {"user_attrs": {"x": 1}}),
        ("PUT", f"/api/studies/{sample.study_id}/note", {"version": 1, "body": "hi"}),
        ("PUT", f"/api/studies/{sample.study_id}/{tid}/note", {"version": 1, "body": "hi"}),
        ("POST", "/incompatible-rdb-schema", None),
    ]
    for method, path, body in requests:
        status, _, payload = call(read_only, method, path, body)
        assert (method, path, status) == (method, path, 403)
        assert json.loads(payload)["reason"] == dashboard.READ_ONLY_REASON
    assert snapshot(sample.url) == before


# Every GET route optuna-dashboard 0.21 has; none of them writes. A new one (an upgrade) fails
# this test so that someone checks it does not change the store before it is served.
KNOWN_READ_ROUTES = {
    "/",
    "/dashboard<:re:(/.*)?>",
    "/api/meta",
    "/api/studies",
    "/api/studies/<study_id:int>",
    "/api/studies/<study_id:int>/param_importances",
    "/api/studies/<study_id:int>/plot/<plot_type>",
    "/csv/<study_id:int>",
    "/favicon.ico",
    "/static/<filename:path>",
    "/incompatible-rdb-schema",
    "/artifacts/<study_id:int>/<artifact_id:re:[0-9a-fA-F-]+>",
    "/artifacts/<study_id:int>/<trial_id:int>/<artifact_id:re:[0-9a-fA-F-]+>",
}


def test_every_write_route_is_refused(
    read_only: dashboard.DashboardApp, sample: SampleStudy
) -> None:
    with open_storage(sample.url, create=False) as store:
        routes = optuna_dashboard.wsgi(store.optuna_storage).routes  # type: ignore[attr-defined]
    values = {"study_id": str(sample.study_id), "trial_id": str(trial_id(sample, 1))}

    def concrete(rule: str) -> str:
        return re.sub(r"<(\w*)(:[^>]*)?>", lambda m: values.get(m.group(1), "0a1b-2c"), rule)

    reads = {r.rule for r in routes if r.method in dashboard.SAFE_METHODS}
    writes = [(r.method, r.rule) for r in routes if r.method not in dashboard.SAFE_METHODS]
    assert reads == KNOWN_READ_ROUTES
    assert len(writes) >= 19
    assert ("DELETE", "/api/studies/<study_id:int>") in writes
    assert ("POST", "/incompatible-rdb-schema") in writes

    before = snapshot(sample.url)
    for method, rule in writes:
        status, _, _ = call(read_only, method, concrete(rule), {"body": "x", "version": 9})
        assert (method, rule, status) == (method, rule, 403)
    for method in ("PATCH", "TRACE", "CONNECT", "PROPFIND"):
        assert call(read_only, method, "/api/studies")[0] == 403
    assert snapshot(sample.url) == before


def test_allow_writes_lets_delete_through(sample: SampleStudy) -> None:
    app = dashboard.make_app(sample.url, allow_writes=True)
    try:
        status, _, _ = call(app, "DELETE", f"/api/studies/{sample.study_id}")
    finally:
        app.close()
    assert status == 204
    assert snapshot(sample.url) == []


def test_make_app_without_a_storage_says_so(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="budgettune search"):
        dashboard.make_app(str(tmp_path / "missing.db"), allow_writes=False)
    assert not (tmp_path / "missing.db").exists()


# ------------------------------------------------------------------------------ our views


def study_detail(sample: SampleStudy) -> dict[str, Any]:
    app = dashboard.make_app(sample.url, allow_writes=False)
    try:
        status, _, body = call(app, "GET", f"/api/studies/{sample.study_id}")
    finally:
        app.close()
    assert status == 200
    return json.loads(body)


def publish(sample: SampleStudy) -> None:
    with open_storage(sample.url, create=False) as store:
        publish_views(store, sample.study_name)


def test_publish_views_puts_note_and_plot_into_the_study_page(sample: SampleStudy) -> None:
    publish(sample)
    detail = study_detail(sample)

    note = detail["note"]["body"]
    assert f"Current pin: trial {PIN_TRIAL}" in note
    assert "`budget 0.35, optimizer as_written`" in note
    assert "131.00 MB (124.93 MiB), 87.3% of the limit, set in optimizer" in note
    assert "| step time (median) | 42.40 ms |" in note
    assert "+6.0%" in note
    assert "optimizer step, which recompute cannot lower" in note
    assert "3 fit, 3 measured over the limit, 1 OOM, 1 crashed, timed out or had a" in note

    [graph] = detail["plotly_graph_objects"]
    assert graph["id"] == PLOT_ID
    figure = json.loads(graph["graph_object"])
    traces = {trace["name"]: trace for trace in figure["data"]}
    assert set(traces) == {
        "fits (3)",
        "over the limit (3)",
        "OOM (no figures) (1)",
        "baselines",
        f"pinned (trial {PIN_TRIAL})",
    }
    assert sorted(traces["fits (3)"]["x"]) == [95.0, 110.0, 128.0]
    assert traces["baselines"]["text"] == ["unconstrained", "block-ac-every-1", "budget-0.5"]
    assert traces[f"pinned (trial {PIN_TRIAL})"]["x"] == [131.0]
    assert traces[f"pinned (trial {PIN_TRIAL})"]["y"] == [42.4]
    [limit_line] = figure["layout"]["shapes"]
    assert limit_line["x0"] == limit_line["x1"] == LIMIT_BYTES / 1e6
    assert figure["layout"]["annotations"][0]["text"] == "--max-mem 150.00 MB"
    assert figure["layout"]["xaxis"]["title"]["text"] == "peak device memory (MB)"


def test_publish_views_again_replaces_instead_of_piling_up(sample: SampleStudy) -> None:
    publish(sample)
    first = study_detail(sample)
    with open_storage(sample.url, create=False) as store:
        keys = set(store.optuna_storage.get_study_system_attrs(sample.study_id))
    publish(sample)
    second = study_detail(sample)
    with open_storage(sample.url, create=False) as store:
        assert set(store.optuna_storage.get_study_system_attrs(sample.study_id)) == keys
    assert second["plotly_graph_objects"] == first["plotly_graph_objects"]
    assert second["note"]["body"] == first["note"]["body"]
    assert second["note"]["version"] == first["note"]["version"] + 1


def test_publish_views_before_any_pin(tmp_path: Path) -> None:
    sample = make_study(tmp_path / "budgettune.db", with_pin=False)
    publish(sample)
    detail = study_detail(sample)
    assert "### No pin yet" in detail["note"]["body"]
    names = {
        trace["name"]
        for trace in json.loads(detail["plotly_graph_objects"][0]["graph_object"])["data"]
    }
    assert not any(name.startswith("pinned") for name in names)


def test_publish_views_of_an_unknown_study(sample: SampleStudy) -> None:
    with open_storage(sample.url, create=False) as store:
        with pytest.raises(StudyNotFoundError, match="no-such-study"):
            publish_views(store, "no-such-study")


# ------------------------------------------------------------------------------ the server


@pytest.fixture
def served(read_only: dashboard.DashboardApp) -> Iterator[str]:
    server = dashboard.make_server(read_only, host="127.0.0.1", port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_real_server_reads_and_refuses_writes(served: str, sample: SampleStudy) -> None:
    assert http("GET", f"{served}/api/studies/{sample.study_id}")[0] == 200
    status, body = http("DELETE", f"{served}/api/studies/{sample.study_id}")
    assert (status, json.loads(body)["reason"]) == (403, dashboard.READ_ONLY_REASON)
    # a sizeable body is read before the 403, so the client sees the answer, not a reset
    status, _ = http("POST", f"{served}/api/artifacts/{sample.study_id}", b"x" * 300_000)
    assert status == 403
    assert http("GET", f"{served}/api/studies")[0] == 200


def test_dashboard_reads_while_a_search_writes(served: str, sample: SampleStudy) -> None:
    """SQLite in WAL mode with a busy timeout: the writer never sees 'database is locked'."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                assert http("GET", f"{served}/api/studies/{sample.study_id}")[0] == 200
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)
                return

    readers = [threading.Thread(target=reader) for _ in range(4)]
    for thread in readers:
        thread.start()
    try:
        with open_storage(sample.url) as store:
            study = optuna.load_study(study_name=sample.study_name, storage=store.optuna_storage)
            for number in range(10):
                trial = study.ask()
                trial.set_user_attr("outcome", "ok")
                study.tell(trial, 50.0 + number)
            publish_views(store, sample.study_name)
    finally:
        stop.set()
        for thread in readers:
            thread.join(timeout=10)
    assert errors == []
    # the dashboard caches a study's trials for 2 s; then it shows the new ones
    deadline = time.monotonic() + 10
    while len(trials_seen(served, sample)) < 18 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(trials_seen(served, sample)) == 18


def trials_seen(served: str, sample: SampleStudy) -> list[Any]:
    return json.loads(http("GET", f"{served}/api/studies/{sample.study_id}")[1])["trials"]


def test_server_line_says_read_only_and_how_to_allow_writes() -> None:
    line = dashboard.describe_server(
        host="127.0.0.1", port=8080, display_url="sqlite:///x.db", allow_writes=False
    )
    assert "http://127.0.0.1:8080/dashboard/" in line
    assert "read-only" in line and "--allow-writes" in line
    line = dashboard.describe_server(
        host="127.0.0.1", port=8080, display_url="sqlite:///x.db", allow_writes=True
    )
    assert "WRITES ALLOWED" in line


def test_port_in_use_is_a_usage_error(served: str, read_only: dashboard.DashboardApp) -> None:
    port = int(served.rsplit(":", 1)[1])
    with pytest.raises(UsageError, match="pick another --port"):
        dashboard.make_server(read_only, host="127.0.0.1", port=port)
