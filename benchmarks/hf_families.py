"""Every `transformers` family a user may bring, as a tiny CPU trial: does each knob run?

    python -m benchmarks.hf_families --out benchmarks/results/cpu-hf-families-DATE/T.jsonl

Runs `budgettune trial -w hf:FAMILY -o tiny=true` (B=2, T=32, codegen-free backend) once per
family and knob (budget 0.5, block AC op policy, block AC full) in a fresh process each, the
way a search would, and appends one JSON line per run: family, knobs, transformers version,
outcome, model changes, the error's first line. Resumable: lines already in the file are
skipped. A family the installed `transformers` does not know is recorded as ``unknown``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

FAMILIES = (
    # decoder-only language models
    "gpt2 llama mistral qwen2 qwen3 gemma gemma2 gemma3_text phi3 opt gpt_neox falcon bloom "
    "gptj codegen starcoder2 olmo2 mamba "
    # mixtures of experts
    "mixtral qwen2_moe "
    # encoders
    "bert roberta distilbert electra "
    # encoder-decoders
    "t5 mt5 bart pegasus whisper "
    # vision
    "vit swin convnext"
).split()
KNOBS = {
    "budget-0.5": ["--budget", "0.5"],
    "ac-op": ["--ac-every", "1", "--ac-policy", "op"],
    "ac-full": ["--ac-every", "1", "--ac-policy", "full"],
}


def run(family: str, knobs: list[str]) -> dict[str, Any]:
    """One trial subprocess; its JSON result, summarised."""
    done = subprocess.run(
        [sys.executable, "-m", "budgettune", "trial", "-w", f"hf:{family}"]
        + ["-o", "tiny=true", "-o", "batch_size=2", "-o", "seq_len=32", "--device", "cpu"]
        + ["--backend", "aot_eager_decomp_partition", "--warmup-steps", "1"]
        + ["--timed-steps", "1", "--json", *knobs],
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = done.stdout
    try:
        result = json.loads(text[text.index("{") :])
    except ValueError:  # no result written: the CLI's own one-line error
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"outcome": "error", "error": error[:300]}
    measurement = result.get("measurement") or {}
    error = result.get("error") or ""
    return {
        # the workload's own error when this transformers has no such model type
        "outcome": "unknown" if "nor a model type transformers" in error else result["outcome"],
        "model_changes": result.get("model_changes", []),
        "error": error[:300],
        "peak_allocated_bytes": measurement.get("peak_allocated_bytes"),
        "step_time_ms": measurement.get("step_time_ms"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    args = parser.parse_args(argv)
    import torch
    import transformers

    version = transformers.__version__
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            record = json.loads(line)
            done.add((record["family"], record["knobs"], record["transformers"]))
    failed = 0
    for family in args.families:
        for name, knobs in KNOBS.items():
            if (family, name, version) in done:
                continue
            record = {
                "family": family,
                "knobs": name,
                "transformers": version,
                "torch": torch.__version__,
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                **run(family, knobs),
            }
            failed += record["outcome"] != "ok"
            print(f"{family:12} {name:10} {record['outcome']:8} {record['error'][:120]}")
            with args.out.open("a") as f:
                f.write(json.dumps(record) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
