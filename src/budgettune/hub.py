"""Hub ids in ``hf:`` references: a model's ``config.json`` through the Hugging Face cache.

``hf:meta-llama/Llama-3.2-1B`` names a model as people name it. Only its ``config.json`` is
fetched, with `huggingface_hub.hf_hub_download` into the cache `transformers` reads too
(``HF_HOME``, or ``HF_HUB_CACHE``): offline mode (``HF_HUB_OFFLINE=1``) is honoured, and the
token of a gated repository comes from where `huggingface_hub` looks for it (``HF_TOKEN``, or
the file ``hf auth login`` writes). No weights are fetched: the model is built from the config
with random weights.

An existing folder always wins over a Hub id of the same spelling (``hf:ckpt/run1`` with a
folder ``ckpt/run1`` here is that folder, as `transformers.AutoConfig.from_pretrained` would
read it). Torch and `transformers` are not imported here: the parent checks a reference with
this module before any trial starts, so every trial then reads the cached file.
"""

from __future__ import annotations

import importlib
import logging
import re
from pathlib import Path
from typing import Any

from budgettune.errors import WorkloadError, one_line

HUB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
"""``ORG/NAME``: one slash, letters, digits, ``. _ -``; a path such as ``./ckpt``,
``/abs/ckpt`` or ``runs/a/b`` is not one."""
CONFIG_FILE = "config.json"


def is_hub_id(source: str) -> bool:
    """Whether ``source`` (what follows ``hf:``) is read as a Hub id: ``ORG/NAME`` and no
    folder of that name exists here."""
    return bool(HUB_ID_PATTERN.match(source)) and not Path(source).exists()


def _download_command(repo_id: str) -> str:
    return (
        f"run `hf download {repo_id} {CONFIG_FILE}` (older huggingface_hub: "
        f"`huggingface-cli download {repo_id} {CONFIG_FILE}`) where the Hub is reachable, "
        "with the same HF_HOME"
    )


def hub_config_folder(repo_id: str) -> Path:
    """The cached snapshot folder holding ``repo_id``'s ``config.json``, fetched if needed.

    Args:
        repo_id: ``ORG/NAME`` (see `is_hub_id`).

    Returns:
        The folder (``$HF_HOME/hub/models--ORG--NAME/snapshots/REV``) with ``config.json``.

    Raises:
        WorkloadError: one line: `huggingface_hub` missing; offline (or the Hub unreachable)
            and the file not cached, with the command that fetches it; a gated, private or
            unknown repository; a repository without ``config.json``.
    """
    try:
        hub: Any = importlib.import_module("huggingface_hub")
        errors: Any = importlib.import_module("huggingface_hub.errors")
        constants: Any = importlib.import_module("huggingface_hub.constants")
    except ImportError:
        raise WorkloadError(
            f"hf:{repo_id}: reading a Hub id needs transformers (and its huggingface_hub): "
            "pip install 'budgettune[hf]'"
        ) from None
    where = f"hf:{repo_id}"
    # its retries log a warning each (with the CLI's logging, about 22 lines before our one,
    # issue 48): the error below says what failed and what to run. A filter on the logger
    # that logs them (huggingface_hub sets its own level again while it downloads).
    http_log = logging.getLogger("huggingface_hub.utils._http")
    quiet = _BelowError()
    http_log.addFilter(quiet)
    try:
        path = hub.hf_hub_download(repo_id=repo_id, filename=CONFIG_FILE)
    except errors.LocalEntryNotFoundError:
        cache = constants.HF_HUB_CACHE
        if constants.HF_HUB_OFFLINE:
            reason = f"offline (HF_HUB_OFFLINE) and {CONFIG_FILE} is not in the cache {cache}"
        else:
            reason = f"the Hub is unreachable and {CONFIG_FILE} is not in the cache {cache}"
        raise WorkloadError(f"{where}: {reason}; {_download_command(repo_id)}") from None
    except errors.GatedRepoError:
        raise WorkloadError(
            f"{where} is gated: accept its terms on https://huggingface.co/{repo_id}, then log "
            "in (`hf auth login`, or set HF_TOKEN)"
        ) from None
    except errors.RepositoryNotFoundError:
        raise WorkloadError(
            f"{where}: no such folder here and no such model on the Hub (a private one needs "
            "`hf auth login` or HF_TOKEN)"
        ) from None
    except errors.EntryNotFoundError:
        raise WorkloadError(
            f"{where}: the repository has no {CONFIG_FILE} (not a transformers model?)"
        ) from None
    except errors.HFValidationError as exc:
        raise WorkloadError(f"{where}: not a Hub id ({one_line(exc)})") from None
    except OSError as exc:  # HTTP errors (HfHubHTTPError), disk errors
        raise WorkloadError(f"{where}: fetching {CONFIG_FILE} failed: {one_line(exc)}") from None
    finally:
        http_log.removeFilter(quiet)
    return Path(path).parent


class _BelowError(logging.Filter):
    """Drops records below ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR
