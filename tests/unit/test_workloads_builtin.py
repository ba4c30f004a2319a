"""The built-in workloads: structure, sizes, determinism, and a real step at tiny sizes on CPU."""

from __future__ import annotations

import torch
import torch._functorch.config as functorch_config
import torch.nn.functional as F
from torch import nn

from budgettune.workload import Workload, fingerprint, load_workload
from budgettune.workloads import llama, vit
from budgettune.workloads.losses import next_token_loss

CPU = torch.device("cpu")
META = torch.device("meta")
TINY_LLAMA = {
    "dim": 64,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "ffn_dim": 128,
    "vocab_size": 256,
    "batch_size": 2,
    "seq_len": 32,
}
TINY_VIT = {
    "image_size": 32,
    "patch_size": 8,
    "dim": 64,
    "n_layers": 2,
    "n_heads": 4,
    "mlp_dim": 128,
    "num_classes": 10,
    "batch_size": 3,
}
# Llama-3.2-1B: embedding 128256*2048 (tied with the head) + 16 * (attention 2048*(2048+512+512)
# + 2048*2048, SwiGLU 3*2048*8192, two norms 2*2048) + final norm 2048.
LLAMA_32_1B_PARAMS = (
    128256 * 2048 + 16 * (2048 * 3072 + 2048 * 2048 + 3 * 2048 * 8192 + 4096) + 2048
)
VIT_B16_PARAMS = 86_567_656  # timm vit_base_patch16_224


def _train_step(workload: Workload) -> float:
    optimizer = workload.optimizer(workload.model.parameters()) if workload.optimizer else None
    assert optimizer is not None
    loss = workload.loss(workload.model, workload.batch)
    loss.backward()
    grads = [p.grad for p in workload.model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def test_llama_default_is_the_reference_shape_with_an_untied_head() -> None:
    # The pre-project reference measured an untied head (its steady bytes say so).
    workload = load_workload("builtin:llama", META)
    model = workload.model
    assert model.output.weight is not model.tok_embeddings.weight
    assert fingerprint(workload).param_count == LLAMA_32_1B_PARAMS + 128256 * 2048
    assert workload.loss is next_token_loss


def test_llama_tied_is_llama_32_1b_shape_on_meta() -> None:
    assert LLAMA_32_1B_PARAMS == 1_235_814_400
    workload = load_workload("builtin:llama", META, {"tie_embeddings": True, "fp32_loss": True})
    assert workload.loss is llama._loss_fp32
    fp = fingerprint(workload)
    assert fp.param_count == LLAMA_32_1B_PARAMS
    assert fp.param_bytes == 2 * LLAMA_32_1B_PARAMS
    assert fp.batch == ("int64[4, 1024]", "int64[4, 1024]")
    model = workload.model
    assert isinstance(model, llama.Llama)
    assert model.output.weight is model.tok_embeddings.weight
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    attention = model.layers[0].attention
    assert (attention.wq.out_features, attention.wk.out_features) == (2048, 512)
    assert model.layers[0].feed_forward.w1.out_features == 8192
    assert workload.blocks is not None and len(workload.blocks) == 16


def test_llama_tiny_forward_backward_on_cpu() -> None:
    torch.manual_seed(0)
    workload = load_workload("builtin:llama", CPU, TINY_LLAMA)
    model = workload.model
    assert isinstance(model, llama.Llama)
    attention = model.layers[0].attention
    assert attention.wq.weight.shape == (64, 64)
    assert attention.wk.weight.shape == (32, 64)  # 2 KV heads of head_dim 16
    assert attention.wv.weight.shape == (32, 64)
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Linear))
    assert workload.blocks == list(model.layers)
    tokens, labels = workload.batch
    assert tokens.shape == labels.shape == (2, 32)
    assert torch.equal(tokens[:, 1:], labels[:, :-1])
    logits = model(tokens)
    assert logits.dtype == torch.bfloat16 and logits.shape == (2, 32, 256)
    loss = _train_step(workload)
    assert abs(loss - torch.log(torch.tensor(256.0)).item()) < 1.0


def test_llama_gqa_matches_repeated_kv_heads() -> None:
    torch.manual_seed(0)
    attention = llama.Attention(64, 4, 2)
    x = torch.randn(2, 8, 64)
    cos, sin = torch.ones(8, 16), torch.zeros(8, 16)
    q = attention.wq(x).view(2, 8, 4, 16).transpose(1, 2)
    k = attention.wk(x).view(2, 8, 2, 16).transpose(1, 2).repeat_interleave(2, dim=1)
    v = attention.wv(x).view(2, 8, 2, 16).transpose(1, 2).repeat_interleave(2, dim=1)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = attention.wo(expected.transpose(1, 2).reshape(2, 8, 64))
    torch.testing.assert_close(attention(x, cos, sin), expected)


def test_vit_default_is_vit_b16_shape_on_meta() -> None:
    workload = load_workload("builtin:vit", META)
    fp = fingerprint(workload)
    assert fp.param_count == VIT_B16_PARAMS
    assert fp.batch == ("bfloat16[64, 3, 224, 224]", "int64[64]")
    assert workload.blocks is not None and len(workload.blocks) == 12


def test_vit_tiny_forward_backward_on_cpu() -> None:
    torch.manual_seed(0)
    workload = load_workload("builtin:vit", CPU, TINY_VIT)
    model = workload.model
    assert isinstance(model, vit.VisionTransformer)
    assert model.pos_embed.shape == (1, 17, 64)  # 4x4 patches + class token
    assert workload.blocks == list(model.blocks)
    images, labels = workload.batch
    assert images.dtype == torch.bfloat16 and images.shape == (3, 3, 32, 32)
    assert model(images).shape == (3, 10)
    _train_step(workload)


def test_builders_are_deterministic_under_the_callers_seed() -> None:
    for ref, options in (
        ("builtin:tiny-gpt", {"d_model": 32, "n_layers": 1, "n_heads": 2}),
        ("builtin:llama", TINY_LLAMA),
        ("builtin:vit", TINY_VIT),
    ):
        runs = []
        for _ in range(2):
            torch.manual_seed(3)
            workload = load_workload(ref, CPU, options)
            runs.append((workload.model.state_dict(), workload.batch))
        (state_a, batch_a), (state_b, batch_b) = runs
        assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
        assert all(torch.equal(a, b) for a, b in zip(batch_a, batch_b, strict=True))
        # The batch comes from its own generator: the global seed does not change it.
        torch.manual_seed(4)
        other = load_workload(ref, CPU, options)
        assert all(torch.equal(a, b) for a, b in zip(batch_a, other.batch, strict=True))


def test_tiny_gpt_compiled_step_under_partitioner_backend() -> None:
    torch.manual_seed(0)
    workload = load_workload(
        "builtin:tiny-gpt", CPU, {"vocab_size": 128, "d_model": 32, "n_layers": 2, "seq_len": 32}
    )
    assert workload.blocks is not None and len(workload.blocks) == 2
    eager_loss = workload.loss(workload.model, workload.batch).item()
    torch._dynamo.reset()
    try:
        with functorch_config.patch(activation_memory_budget=0.5):
            compiled = torch.compile(workload.model, backend="aot_eager_decomp_partition")
            assert workload.optimizer is not None
            optimizer = workload.optimizer(workload.model.parameters())
            losses = []
            for _ in range(2):
                loss = workload.loss(compiled, workload.batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss.item())
    finally:
        torch._dynamo.reset()
    assert abs(losses[0] - eager_loss) < 1e-4
    assert losses[1] < losses[0]
