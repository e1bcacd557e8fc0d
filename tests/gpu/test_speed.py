"""Speed levers (trainer/finetune_trainer/speed.py): packed attention never crosses documents.

The CPU tests check the exact per-document fallback and the whole-model path against transformers' own dense
block-diagonal SDPA mask; the `gpu` ones check torch's varlen flash kernel (skipped without CUDA).
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from finetune_trainer import speed  # noqa: E402

CUDA = torch.cuda.is_available()


def _dense_reference(q, k, v, cu):
    """(T, H, D) attention with an explicit block-diagonal causal mask, in float64."""
    t = q.shape[0]
    doc = torch.zeros(t, dtype=torch.long)
    for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        doc[s:e] = i
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    mask = (doc[:, None] == doc[None, :]) & torch.ones(t, t, dtype=torch.bool).tril()
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double())


def _random_docs(lengths, heads=4, kv_heads=2, dim=16, device="cpu", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    q = torch.randn(t, heads, dim, generator=g).to(device, dtype)
    k = torch.randn(t, kv_heads, dim, generator=g).to(device, dtype)
    v = torch.randn(t, kv_heads, dim, generator=g).to(device, dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu


def test_cu_seqlens_from_position_ids():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    cu, longest = speed.cu_seqlens_from_position_ids(pos)
    assert cu.tolist() == [0, 3, 5, 9] and longest == 4


def test_per_document_fallback_matches_dense_mask():
    q, k, v, cu = _random_docs([5, 1, 9, 3])
    out = speed._per_document_sdpa(q, k, v, cu, None)
    ref = _dense_reference(q, k, v, cu)
    assert (out.double() - ref).norm() / ref.norm() < 1e-5


def _tiny_llama(attn):
    cfg = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32).eval()


def test_model_with_varlen_matches_dense_packed_mask_and_separate_documents():
    model = _tiny_llama("sdpa")
    lengths = [7, 3, 12]
    ids = torch.randint(0, 97, (1, sum(lengths)), generator=torch.Generator().manual_seed(1))
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    with torch.no_grad():
        # transformers builds the dense block-diagonal mask itself from the restarting position_ids
        dense = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        assert speed.use_varlen_attention(model)
        assert model.config._attn_implementation == speed.VARLEN_ATTENTION
        ours = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        # each document alone gives the same logits: nothing crosses a document boundary
        alone = torch.cat([model(input_ids=chunk).logits for chunk in ids.split(lengths, dim=1)], dim=1)
    assert (ours - dense).abs().max() < 1e-4
    assert (ours - alone).abs().max() < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("lengths", [[2048, 2048, 2048, 2048], [100, 1500, 7, 2048, 4537]])
def test_varlen_kernel_matches_reference_bf16(lengths):
    if speed._varlen_kernel() is None:
        pytest.skip("this torch has no torch.nn.attention.varlen")
    q, k, v, cu = _random_docs(lengths, heads=32, kv_heads=8, dim=128, device="cuda", dtype=torch.bfloat16)
    q.requires_grad_(True)
    cu_d = cu.cuda()
    kernel = speed._varlen_kernel()
    try:
        out = speed._call_varlen(kernel, q, k, v, cu_d, int(cu.diff().max()), None)
    except (RuntimeError, TypeError):
        speed._state["expand_kv"] = True
        out = speed._call_varlen(kernel, q, k, v, cu_d, int(cu.diff().max()), None)
    ref = _dense_reference(q.detach().cpu().float(), k.cpu().float(), v.cpu().float(), cu)
    err = (out.detach().cpu().double() - ref).norm() / ref.norm()
    assert err < 1e-2, err
    out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_model_varlen_on_gpu_matches_per_document():
    model = _tiny_llama("sdpa").cuda().to(torch.bfloat16)
    lengths = [300, 5, 700]
    ids = torch.randint(0, 97, (1, sum(lengths)), device="cuda")
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0).cuda()
    speed.use_varlen_attention(model)
    with torch.no_grad():
        ours = model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
        alone = torch.cat([model(input_ids=c).logits.float() for c in ids.split(lengths, dim=1)], dim=1)
    assert ((ours - alone).norm() / alone.norm()) < 2e-2


def _cfg(**over):
    from finetune_api.trainer_input import TrainerInput

    base = {
        "job": {"name": "t"},
        "model": {"name": "m"},
        "dataset": {"name": "d", "packing": True},
        "training": {"gradientCheckpointing": False},
        "output": {"checkpointDir": "/c", "adapterDir": "/c/adapter"},
        "strategy": {"zeroStage": 0},
    }
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v}
    return TrainerInput.model_validate(base)


def test_resolve_levers_rules():
    assert speed.resolve_levers(_cfg(), cuda=False, env={}) == set()
    assert speed.resolve_levers(_cfg(), cuda=True, env={}) == {"varlen", "compile", "fused_adamw"}
    zero3 = speed.resolve_levers(
        _cfg(strategy={"zeroStage": 3}, training={"gradientCheckpointing": True}), cuda=True, env={}
    )
    assert "compile" not in zero3 and "fused_adamw" not in zero3 and "varlen" in zero3
    assert "compile" not in speed.resolve_levers(_cfg(training={"gradientCheckpointing": True}), cuda=True, env={})
    assert "varlen" not in speed.resolve_levers(_cfg(dataset={"packing": False}), cuda=True, env={})
    assert speed.resolve_levers(_cfg(), cuda=True, env={"FTJOB_SPEED": "none"}) == set()
    assert speed.resolve_levers(_cfg(), cuda=False, env={"FTJOB_SPEED": "varlen"}) == {"varlen"}
    with pytest.raises(ValueError):
        speed.parse_levers("warp-drive")


def test_checkpointed_layer_indices_spread_from_the_first():
    assert speed.checkpointed_layer_indices(32, 0) == []
    assert speed.checkpointed_layer_indices(32, 1) == [0]
    assert speed.checkpointed_layer_indices(32, 4) == [0, 8, 16, 24]
    assert speed.checkpointed_layer_indices(32, 11) == [0, 2, 5, 8, 11, 14, 17, 20, 23, 26, 29]
    assert speed.checkpointed_layer_indices(32, 32) == list(range(32))
    assert len(speed.checkpointed_layer_indices(80, 47)) == 47


def _tiny_llama_layers(layers: int):
    cfg = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float64)


def test_checkpoint_only_checkpoints_the_planned_layers_and_keeps_gradients_exact():
    """Partial checkpointing (gradientCheckpointing: auto's middle ground): exactly the planned layers recompute,
    through transformers' own enable path, and the gradients equal those without checkpointing (float64)."""
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(3))

    def grads(model):
        model.train()
        model.zero_grad()
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    reference = grads(_tiny_llama_layers(6))
    model = _tiny_llama_layers(6)
    speed.checkpoint_only(model, 2)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    flags = [layer.gradient_checkpointing for layer in model.model.layers]
    assert flags == [True, False, False, True, False, False]
    recomputed: list[int] = []
    for index, layer in enumerate(model.model.layers):  # counted by wrapping forward (hooks do not rerun here)

        def counted(*args, _forward=layer.mlp.forward, _index=index, **kwargs):
            recomputed.append(_index)
            return _forward(*args, **kwargs)

        layer.mlp.forward = counted
    ours = grads(model)
    # each layer's MLP runs once in the forward pass; the checkpointed ones once more in the backward pass
    assert sorted(recomputed) == sorted([*range(6), 0, 3])
    assert ours.keys() == reference.keys()
    for name, grad in reference.items():
        assert torch.equal(ours[name], grad), name
    model.gradient_checkpointing_disable()
    assert not any(layer.gradient_checkpointing for layer in model.model.layers)


def test_resolve_levers_reads_the_planners_checkpointing():
    """trainer.json carries the planner's resolved choice: off gets compile, any checkpointing does not."""
    off = speed.resolve_levers(_cfg(training={"gradientCheckpointing": False}), cuda=True, env={})
    partial = _cfg(training={"gradientCheckpointing": True}, strategy={"checkpointedLayers": 11})
    assert "compile" in off
    assert "compile" not in speed.resolve_levers(partial, cuda=True, env={})


def test_once_logs_in_eager_code_and_never_breaks_a_compiled_graph(caplog):
    """A log line inside a compiled decoder layer split every layer's graph in two (dynamo cannot trace Logger
    calls); `_once` is silent while dynamo traces and still logs once in eager code."""
    from torch._dynamo.utils import counters

    speed._state["warned"].discard("test-once")

    def layer(x):
        speed._once("test-once", "seen inside a compiled function")
        return x * 2

    torch._dynamo.reset()
    counters.clear()
    out = torch.compile(layer, backend="eager", fullgraph=True)(torch.ones(3))
    assert torch.equal(out, torch.full((3,), 2.0))
    assert not counters["graph_break"]
    assert "test-once" not in speed._state["warned"]  # nothing was logged while tracing
    with caplog.at_level("INFO", logger=speed.log.name):
        layer(torch.ones(1))
        layer(torch.ones(1))
    assert [r.getMessage() for r in caplog.records].count("seen inside a compiled function") == 1


def test_padding_packed_batches_changes_neither_loss_nor_gradients():
    """`speed.PACKED_PAD_MULTIPLE`: TRL's padding-free collator with pad_to_multiple_of appends one-token documents
    labelled -100; the loss and every gradient equal the unpadded batch's (varlen path, float64)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    model = _tiny_llama_layers(2)
    speed.use_varlen_attention(model)
    model.train()
    g = torch.Generator().manual_seed(5)
    docs = [{"input_ids": torch.randint(1, 97, (n,), generator=g).tolist(), "seq_lengths": [n]} for n in (9, 5, 13)]

    def loss_and_grads(multiple):
        collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, pad_to_multiple_of=multiple)
        batch = collate(docs)
        model.zero_grad()
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        return batch, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain_batch, plain_loss, plain_grads = loss_and_grads(None)
    padded_batch, padded_loss, padded_grads = loss_and_grads(speed.PACKED_PAD_MULTIPLE)
    assert plain_batch["input_ids"].shape[1] == 27
    assert padded_batch["input_ids"].shape[1] == 64
    assert padded_batch["cu_seq_lens_q"].numel() == 4 + 37  # three documents, then one per pad token
    assert torch.allclose(padded_loss, plain_loss, rtol=0, atol=1e-12)
    assert padded_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        assert torch.allclose(padded_grads[name], grad, rtol=1e-10, atol=1e-12), name


def test_packed_batches_are_padded_only_into_compiled_layers():
    assert speed.pad_to_multiple_of({"varlen", "compile"}, packing=True) == speed.PACKED_PAD_MULTIPLE
    assert speed.pad_to_multiple_of({"varlen", "liger"}, packing=True) is None
    assert speed.pad_to_multiple_of({"compile"}, packing=False) is None


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_compiled_layers_with_varlen_attention_have_no_graph_break():
    """The trainer's compiled path on CUDA: every decoder layer one graph (varlen kernel inside), losses equal eager's
    over batches of different token counts and document counts, padded as the trainer pads them."""
    from torch._dynamo.utils import counters
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    def model_on_gpu():
        model = _tiny_llama("sdpa").to("cuda", torch.bfloat16).train()
        speed.use_varlen_attention(model)
        return model

    g = torch.Generator().manual_seed(7)
    collate = DataCollatorForLanguageModeling(
        pad_token_id=0, padding_free=True, pad_to_multiple_of=speed.PACKED_PAD_MULTIPLE
    )
    batches = []
    for lengths in ((100, 37, 60), (250, 3), (17, 17, 17, 90, 5)):
        docs = [{"input_ids": torch.randint(1, 97, (n,), generator=g).tolist(), "seq_lengths": [n]} for n in lengths]
        batches.append({k: (v.cuda() if hasattr(v, "cuda") else v) for k, v in collate(docs).items()})
    eager = model_on_gpu()
    compiled = model_on_gpu()
    torch._dynamo.reset()
    counters.clear()
    assert speed.compile_layers(compiled) == 2
    for batch in batches:
        want = eager(**batch, use_cache=False).loss
        got = compiled(**batch, use_cache=False).loss
        got.backward()
        assert abs(float(got) - float(want)) < 2e-2 * abs(float(want))
    assert not counters["graph_break"], dict(counters["graph_break"])
    # the token count is dynamic from the first compile; at most one recompile (the documents' longest length, an
    # int, seen to change) for three batches of different token and document counts
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


def test_compiled_layers_take_a_new_token_count_without_recompiling():
    """`speed.mark_tokens_dynamic`: the first compile is general in the token count, so a batch of another length
    (packed documents of varying length) reuses it instead of recompiling every layer late in a run."""
    from torch._dynamo.utils import counters

    model = _tiny_llama_layers(2)
    eager = _tiny_llama_layers(2)
    torch._dynamo.reset()
    counters.clear()
    assert speed.compile_layers(model, backend="eager") == 2
    g = torch.Generator().manual_seed(11)
    for tokens in (24, 40, 17, 64):
        ids = torch.randint(0, 97, (1, tokens), generator=g)
        got = model(input_ids=ids, labels=ids, use_cache=False).loss
        assert torch.allclose(got, eager(input_ids=ids, labels=ids, use_cache=False).loss)
        got.backward()
    assert counters["stats"]["unique_graphs"] == 1  # one graph, shared by both layers and all four lengths
    assert not counters["graph_break"]
