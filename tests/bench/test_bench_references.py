"""The bench's second P1 reference and the P4/P6 floors measure what their tables say (cheap: tiny shapes)."""

import torch

from attnlab.models.transformer_mt import TransformerMT
from bench.models import Shape, ours, torch_layers_lm
from bench.p4_generate import floor_seconds, linear_weights, matmul_floor
from bench.p6_beam import step_weights

TINY = Shape(vocab=64, d_model=32, n_layers=2, n_heads=4, seq_len=16, max_len=16)


def test_torch_layers_lm_matches_ours_in_size_and_is_causal():
    ref, mine = torch_layers_lm(TINY), ours(TINY)
    assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in mine.parameters())
    ids = torch.randint(0, TINY.vocab, (2, 10), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % TINY.vocab
    with torch.no_grad():
        a, b = ref(ids), ref(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])  # the causal mask: later tokens never reach earlier logits
    assert not torch.allclose(a[:, 6:], b[:, 6:])
    loss = ref.loss(ids, ids)
    loss.backward()
    assert loss.isfinite() and ref.layers.layers[0].linear1.weight.grad is not None


def test_floors_read_each_weight_once_and_skip_what_decoding_does_not_repeat():
    lm = ours(TINY)
    weights = linear_weights(lm)
    assert len(weights) == 4 * TINY.n_layers + 1  # qkv, out, up, down per layer; the tied head once
    torch.manual_seed(0)
    mt = TransformerMT(TINY.vocab, d_model=32, n_layers=2, n_heads=4, max_len=16, dropout=0.0)
    step = step_weights(mt)
    kv = {layer.cross_attn.kv_proj.weight.data_ptr() for layer in mt.decoder.layers}
    assert len(step) == 6 * 2 + 1 and not kv & {w.data_ptr() for w in step}  # no encoder, no cross keys/values
    for layout in ("stored", "transposed"):
        matmul_floor(step, batch=5, steps=2, layout=layout)()
    seconds, note = floor_seconds({"ours": [9.0], "floor (out,in)": [2.0, 4.0], "floor (in,out)": [1.0, 2.0]})
    assert seconds == 1.5 and "(out,in) 3,000 ms" in note
