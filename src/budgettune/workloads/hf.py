"""``hf:DIR_OR_TYPE``: a Hugging Face `transformers` model from its config, random weights.

``hf:path/to/checkpoint`` reads the folder's ``config.json`` (no weights are read: memory and
step time do not depend on their values); ``hf:gpt2`` / ``hf:llama`` / ``hf:bert`` /
``hf:mixtral`` / ``hf:vit`` build the model type's default config; ``hf:ORG/NAME`` (a Hub id,
when no such folder exists) reads that model's ``config.json`` from the Hugging Face cache,
fetching that one file if needed (`budgettune.hub`). Options that are not this
builder's own (``batch_size``, ``seq_len``, ``task``, ``dtype``, ``tiny``, ``seed``,
``keep_dropout``) override config attributes (``-o n_layer=24 -o n_embd=1024``); an attribute
the config does not have is an error, so a typo is not silently ignored. No weights are
downloaded.

The batch is synthetic: token ids (with labels) for language models (an encoder-decoder's
decoder reads the labels shifted right), padded with an attention mask for sequence
classification (each row shorter than the last by T/8, cycling), images for vision models; the
loss is the model's own (``model(**batch).loss``).

Dropout is set to 0 unless ``keep_dropout=true``: recomputation re-draws dropout masks, so a
budget below 1.0 would fail the numerics check against the budget-1.0 reference on dropout
alone (and dropout changes neither memory nor step time in any way the search could use).
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
from pathlib import Path
from typing import Any

import torch

from budgettune.errors import WorkloadError, one_line
from budgettune.hub import hub_config_folder, is_hub_id
from budgettune.workload import Workload

log = logging.getLogger(__name__)

INSTALL_HINT = "hf: workloads need transformers: pip install 'budgettune[hf]'"
TASKS = ("causal-lm", "seq2seq-lm", "sequence-classification", "image-classification")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: ``tiny=true``: a config small enough for a CPU test (only attributes the config has are set).
TINY: dict[str, Any] = {
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "n_positions": 128,
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "num_local_experts": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "image_size": 32,
    "patch_size": 8,
    # GPT-J's and CodeGen's rotary slice of a head (16 wide here)
    "rotary_dim": 8,
    # Falcon's
    "num_kv_heads": 2,
    "ffn_hidden_size": 128,
    # encoder-decoder families: BART's and Whisper's stacks, T5's
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
    "d_ff": 128,
    "d_kv": 16,
}


def _transformers() -> Any:
    if importlib.util.find_spec("transformers") is None:
        raise WorkloadError(INSTALL_HINT)
    import transformers

    return transformers


def _config_folder(source: str) -> Path | None:
    """The folder whose config.json the source names (a local one, or a Hub id's cached
    snapshot), or None for a model type."""
    if is_hub_id(source):
        return hub_config_folder(source)
    folder = Path(source)
    if (folder / "config.json").is_file():
        return folder
    if folder.exists():
        raise WorkloadError(f"hf:{source}: no config.json in that folder")
    if "/" in source:
        raise WorkloadError(f"hf:{source}: no such folder (a Hub id is ORG/NAME)")
    return None


def _base_config(transformers: Any, source: str) -> tuple[Any, str]:
    """The source's config (a folder with config.json, a Hub id, or a model type) and where
    it came from."""
    auto = transformers.AutoConfig
    folder = _config_folder(source)
    if folder is not None:
        return auto.from_pretrained(str(folder)), str(folder)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if source not in CONFIG_MAPPING_NAMES:
        raise WorkloadError(
            f"hf:{source}: not a folder with config.json nor a model type transformers "
            f"{transformers.__version__} knows (e.g. gpt2, llama, bert, mixtral, vit)"
        )
    return auto.for_model(source), source


def _init_parameters(config: Any) -> Any:
    """The arguments the config class's ``__init__`` takes."""
    return inspect.signature(type(config).__init__).parameters


def _accepts(config: Any, key: str) -> bool:
    """An attribute, an ``__init__`` argument, or a key of a nested dict (transformers 5 keeps
    ``rope_theta`` in ``rope_parameters`` and still takes it as an argument)."""
    if hasattr(config, key) or key in _init_parameters(config):
        return True
    return any(isinstance(value, dict) and key in value for value in config.to_dict().values())


def _read_only(config: Any, key: str) -> bool:
    """A property without a setter that ``__init__`` does not take (Falcon's head_dim)."""
    attr = inspect.getattr_static(type(config), key, None)
    return isinstance(attr, property) and attr.fset is None and key not in _init_parameters(config)


def _tiny_changes(base: Any) -> dict[str, Any]:
    """The ``tiny`` sizes this config takes, consistent with the rest of it.

    A size the config holds as a list (Swin's per-stage ``num_heads``) is left alone; a
    hierarchical vision model (per-stage ``depths``) gets one block per stage and keeps its
    image geometry, which its stages' downsampling needs; token ids past the tiny vocabulary
    (Phi-3's pad id 32000) are moved inside it.
    """
    depths = getattr(base, "depths", None)
    if isinstance(depths, (list, tuple)) and depths:
        return {"depths": [1] * len(depths)}
    changes = {
        key: value
        for key, value in TINY.items()
        if hasattr(base, key)
        and not isinstance(getattr(base, key), (list, tuple, dict))
        and not _read_only(base, key)
    }
    vocab = changes.get("vocab_size")
    if vocab is not None:
        for key, value in base.to_dict().items():
            if not key.endswith("_token_id") or isinstance(value, bool):
                continue
            if isinstance(value, int) and value >= vocab:
                changes[key] = vocab - 1
            elif isinstance(value, list) and any(isinstance(v, int) and v >= vocab for v in value):
                changes[key] = [min(v, vocab - 1) for v in value]
    return changes


def _config(transformers: Any, source: str, overrides: dict[str, Any], tiny: bool) -> Any:
    """Build the config again with the tiny sizes and the overrides as keyword arguments, so
    derived attributes (Llama's head_dim) follow them."""
    base, _ = _base_config(transformers, source)
    unknown = sorted(k for k in overrides if not _accepts(base, k))
    if unknown:
        raise WorkloadError(
            f"hf:{source}: {type(base).__name__} has no attribute(s) {', '.join(unknown)}"
        )
    changes = _tiny_changes(base) if tiny else {}
    changes.update(overrides)
    if getattr(base, "pad_token_id", 0) is None:
        changes.setdefault("pad_token_id", 0)  # sequence classification of a decoder needs it
    if getattr(base, "is_encoder_decoder", False) and (
        getattr(base, "decoder_start_token_id", None) is None
    ):
        # the labels shifted right start with it (T5's default config leaves it out)
        pad = changes.get("pad_token_id", getattr(base, "pad_token_id", None))
        changes.setdefault("decoder_start_token_id", pad or 0)
    folder = _config_folder(source)
    if folder is not None:
        return transformers.AutoConfig.from_pretrained(str(folder), **changes)
    return transformers.AutoConfig.for_model(source, **changes)


def zero_dropout(config: Any) -> list[str]:
    """Set every dropout probability of a `transformers` config to 0 (see the module
    docstring); returns the keys it changed."""
    zeroed = []
    for key, value in sorted(config.to_dict().items()):
        if ("dropout" in key or key.endswith("_pdrop")) and isinstance(value, float) and value:
            setattr(config, key, 0.0)
            zeroed.append(key)
    return zeroed


def _default_task(config: Any) -> str:
    from transformers.models.auto import modeling_auto

    # An encoder-decoder trains both halves (BART's causal-LM class is its decoder alone).
    if getattr(config, "is_encoder_decoder", False) and (
        config.model_type in modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
    ):
        return "seq2seq-lm"
    if config.model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "causal-lm"
    if config.model_type in modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
        return "image-classification"
    return "sequence-classification"


def _model_class(transformers: Any, task: str) -> Any:
    return {
        "causal-lm": transformers.AutoModelForCausalLM,
        "seq2seq-lm": transformers.AutoModelForSeq2SeqLM,
        "sequence-classification": transformers.AutoModelForSequenceClassification,
        "image-classification": transformers.AutoModelForImageClassification,
    }[task]


def _max_positions(config: Any) -> int | None:
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None


def _batch(
    config: Any, task: str, batch_size: int, seq_len: int, device: torch.device, dtype: Any
) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    if task == "image-classification":
        size = int(config.image_size)
        channels = int(getattr(config, "num_channels", 3))
        pixels = torch.randn(batch_size, channels, size, size, generator=generator)
        labels = torch.randint(0, config.num_labels, (batch_size,), generator=generator)
        return {"pixel_values": pixels.to(device, dtype), "labels": labels.to(device)}
    limit = _max_positions(config)
    if limit is not None and seq_len > limit:
        raise WorkloadError(
            f"seq_len {seq_len} is longer than the model's {limit} positions; "
            f"pass -o seq_len=N with N <= {limit}, or raise max_position_embeddings"
        )
    ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator)
    if task in ("causal-lm", "seq2seq-lm"):
        # seq2seq: the decoder reads the labels shifted right (decoder_start_token_id first)
        return {"input_ids": ids.to(device), "labels": ids.to(device)}
    # Padding on the right, a different length per row: the attention mask does real work.
    lengths = [seq_len - (row % 4) * max(seq_len // 8, 1) for row in range(batch_size)]
    mask = torch.zeros(batch_size, seq_len, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    ids = ids.masked_fill(mask == 0, int(config.pad_token_id or 0))
    labels = torch.randint(0, config.num_labels, (batch_size,), generator=generator)
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "labels": labels.to(device),
    }


def _model_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


def build(
    device: torch.device,
    source: str,
    batch_size: int = 8,
    seq_len: int = 1024,
    task: str = "",
    dtype: str = "",
    tiny: bool = False,
    seed: int | None = None,
    keep_dropout: bool = False,
    **overrides: Any,
) -> Workload:
    """A `transformers` model from a config, random weights, a synthetic batch.

    Args:
        device: where to build.
        source: a folder holding ``config.json``, a model type (``gpt2``, ``llama``...), or a
            Hub id (``Qwen/Qwen2.5-7B``: its config.json, from the Hugging Face cache).
        batch_size: rows of the batch.
        seq_len: tokens per row (language models).
        task: ``seq2seq-lm`` (the default for an encoder-decoder: T5, BART...), ``causal-lm``
            (the default where the family has one), ``sequence-classification`` or
            ``image-classification`` (the default for vision models).
        dtype: ``bf16`` (the default on CUDA), ``fp16`` or ``fp32`` (the default on CPU):
            the parameters' dtype, as a model loaded with that ``dtype`` has.
        tiny: shrink the config for CPU tests (2 layers, width 64, 256 tokens).
        seed: seed the weights' initialisation (the trial seeds it already).
        keep_dropout: keep the config's dropout probabilities (see the module docstring).
        overrides: config attributes, e.g. ``n_layer=24``.

    Raises:
        WorkloadError: transformers missing, an unknown source, task, dtype or attribute.
    """
    transformers = _transformers()
    config = _config(transformers, source, overrides, tiny)
    task = task or _default_task(config)
    if task not in TASKS:
        raise WorkloadError(f"hf:{source}: unknown task {task!r}; choose one of {TASKS}")
    dtype = dtype or ("bf16" if device.type == "cuda" else "fp32")
    if dtype not in DTYPES:
        raise WorkloadError(f"hf:{source}: unknown dtype {dtype!r}; choose one of {list(DTYPES)}")
    if not keep_dropout:
        zeroed = zero_dropout(config)
        if zeroed:
            log.info(
                "hf:%s: dropout set to 0 (%s); keep it with -o keep_dropout=true", source, zeroed
            )
    if seed is not None:
        torch.manual_seed(seed)
    try:
        model_class = _model_class(transformers, task)
        with torch.device(device):
            model = model_class.from_config(config)
    except ValueError as exc:  # the Auto class has no model for this config and task
        # transformers goes on to list every config class the Auto class takes: one line here
        raise WorkloadError(
            f"hf:{source}: no {task} model for {type(config).__name__}: {one_line(exc)}"
        )
    model = model.to(device=device, dtype=DTYPES[dtype]).train()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the fp32 init's blocks must not count as reserved memory
    batch = _batch(config, task, batch_size, seq_len, device, DTYPES[dtype])
    log.info(
        "hf:%s: %s, %s, %.1fM parameters, batch %s",
        source,
        type(model).__name__,
        dtype,
        sum(p.numel() for p in model.parameters()) / 1e6,
        {k: list(v.shape) for k, v in batch.items()},
    )
    return Workload(model=model, batch=batch, loss=_model_loss)
