"""``hf:ORG/NAME`` (issue 32): a Hub id's config.json from the Hugging Face cache, offline.

No test reaches the Hub: each fills a cache folder with the hub's layout
(``models--ORG--NAME/snapshots/REV/config.json`` and ``refs/main``), as ``hf download`` leaves it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from budgettune.errors import WorkloadError
from budgettune.workload import check_reference, load_workload, reference_origin

transformers = pytest.importorskip("transformers")
hub_constants = pytest.importorskip("huggingface_hub.constants")

REVISION = "0123456789abcdef0123456789abcdef01234567"
CACHED, MISSING = "tiny-org/tiny-llama", "tiny-org/not-cached"
SRC = Path(__file__).resolve().parents[2] / "src"


def _cache(hf_home: Path, repo_id: str) -> None:
    """The hub cache layout `hf download ORG/NAME config.json` leaves under HF_HOME."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    config = transformers.LlamaConfig(
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=200,
        max_position_embeddings=64,
    )
    config.save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)


def test_a_cached_hub_id_builds_its_model_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process huggingface_hub read HF_HOME and HF_HUB_OFFLINE at import: its constants
    stand for them (the subprocess test below sets the real variables)."""
    _cache(tmp_path, CACHED)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    check_reference(f"hf:{CACHED}")
    assert "Hub config of tiny-org/tiny-llama" in reference_origin(f"hf:{CACHED}")
    workload = load_workload(f"hf:{CACHED}", torch.device("cpu"), {"batch_size": 2, "seq_len": 8})
    config = workload.model.config
    assert type(workload.model).__name__ == "LlamaForCausalLM"
    assert (config.hidden_size, config.vocab_size) == (48, 200)  # the cached config's, no default
    assert workload.batch["input_ids"].shape == (2, 8)
    with pytest.raises(WorkloadError) as missing:
        check_reference(f"hf:{MISSING}")
    message = str(missing.value)
    assert "\n" not in message and f"hf download {MISSING} config.json" in message
    assert "HF_HUB_OFFLINE" in message


def test_a_folder_wins_over_a_hub_id_and_a_missing_path_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64).save_pretrained(
        tmp_path / "ckpt" / "run1"
    )
    check_reference("hf:ckpt/run1")  # a folder of that name: no Hub lookup
    workload = load_workload("hf:ckpt/run1", torch.device("cpu"), {"seq_len": 8})
    assert workload.model.config.n_embd == 32
    with pytest.raises(WorkloadError, match="no such folder"):
        check_reference("hf:./ckpt/run2")
    with pytest.raises(WorkloadError, match="no such folder"):
        check_reference("hf:ckpt/run1/deeper")


_PARENT_CHECK = """
import json, sys
from budgettune.errors import WorkloadError
from budgettune.workload import check_reference, reference_origin
check_reference(sys.argv[1])
print(json.dumps({"origin": reference_origin(sys.argv[1])}))
"""


def test_the_real_hf_home_and_offline_variables_are_honoured(tmp_path: Path) -> None:
    """As a user runs it: HF_HOME names the cache, HF_HUB_OFFLINE=1 keeps off the network; the
    parent (no torch) accepts the cached id and refuses the other in one line, exit 2."""
    _cache(tmp_path, CACHED)
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("HF_HUB_CACHE", None)
    cached = subprocess.run(
        [sys.executable, "-c", _PARENT_CHECK, f"hf:{CACHED}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert cached.returncode == 0, cached.stderr
    assert "Hub config of tiny-org/tiny-llama" in json.loads(cached.stdout)["origin"]
    refused = subprocess.run(
        [sys.executable, "-m", "budgettune", "trial", "--workload", f"hf:{MISSING}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert f"hf download {MISSING} config.json" in line and str(tmp_path / "hub") in line
    assert "Traceback" not in refused.stderr


def test_an_unreachable_hub_is_one_line_without_its_retry_warnings(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 48 item 9: huggingface_hub's retries logged about 22 warning lines before the
    error line; they are dropped while budgettune fetches (and only then)."""
    import logging

    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    http_log = logging.getLogger("huggingface_hub.utils._http")

    def unreachable(**_: object) -> str:
        for attempt in range(5):
            http_log.warning("'Name or service not known' thrown; Retrying [Retry %d/5]", attempt)
        raise LocalEntryNotFoundError("unreachable")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    with caplog.at_level(logging.WARNING), pytest.raises(WorkloadError, match="unreachable"):
        check_reference("hf:someorg/somemodel")
    assert not [r for r in caplog.records if r.name.startswith("huggingface_hub")]
    http_log.warning("after the fetch")  # the filter is gone again
    assert any(r.getMessage() == "after the fetch" for r in caplog.records)
