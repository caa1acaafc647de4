import pytest
import torch

from attnlab.core.errors import ConfigError, UserError
from attnlab.models.vit import PatchEmbedding, VisionTransformer
from attnlab.modules.positional import sinusoidal_table_2d
from attnlab.modules.block import EncoderBlock
from attnlab.modules.feedforward import FeedForward
from attnlab.modules.moe import MixtureOfExperts
from attnlab.builders import load_part
from attnlab.modules.positional import LearnedPositions, NoPositions, SinusoidalPositions

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: a second thread only contends


def tiny(**kw) -> VisionTransformer:
    args = dict(image_size=8, patch_size=2, in_channels=1, num_classes=10, d_model=16, n_layers=2, n_heads=2,
                dropout=0.0)
    return VisionTransformer(**{**args, **kw}).eval()


def test_patch_embedding_shape_and_row_major_order():
    torch.manual_seed(0)
    emb = PatchEmbedding(image_size=8, patch_size=2, in_channels=3, d_model=12)
    assert emb.grid == 4 and emb.num_patches == 16
    blank = emb(torch.zeros(1, 3, 8, 8))  # every patch gives the bias
    assert blank.shape == (1, 16, 12)
    for row, col in [(0, 0), (0, 3), (1, 2), (3, 1), (3, 3)]:
        image = torch.zeros(1, 3, 8, 8)
        image[:, :, 2 * row : 2 * row + 2, 2 * col : 2 * col + 2] = torch.randn(3, 2, 2)
        changed = (emb(image) - blank).abs().sum(-1)[0] > 1e-6  # (16,)
        assert changed.nonzero().flatten().tolist() == [row * 4 + col]


def test_patch_embedding_is_a_linear_map_of_the_flattened_patch():
    emb = PatchEmbedding(image_size=4, patch_size=2, in_channels=2, d_model=5)
    image = torch.randn(1, 2, 4, 4)
    patch = image[0, :, 2:4, 0:2].reshape(-1)  # patch (1, 0) -> index 2
    expected = emb.proj.weight.reshape(5, -1) @ patch + emb.proj.bias
    torch.testing.assert_close(emb(image)[0, 2], expected)


def test_bad_geometry_is_refused():
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        PatchEmbedding(image_size=8, patch_size=3, in_channels=1, d_model=4)
    with pytest.raises(ConfigError, match="expected 8×8 images") as e:
        tiny()(torch.zeros(1, 1, 16, 16))
    # a setting (data.image_size vs model.net.image_size), not a bug: train.py prints this one line and exits 2
    assert isinstance(e.value, UserError) and "\n" not in str(e.value)
    assert str(e.value).endswith("give data.image_size and model.net.image_size the same value")


def test_mean_pool_is_the_mean_of_the_patch_outputs():
    torch.manual_seed(0)
    net = tiny()
    torch.nn.init.normal_(net.head.weight)  # the head starts at zero
    images = torch.randn(3, 1, 8, 8)
    tokens = net.features(images)
    assert tokens.shape == (3, 16, 16) and net.num_tokens == 16
    logits = net(images)
    assert logits.shape == (3, 10)
    torch.testing.assert_close(logits, net.head(tokens.mean(dim=1)))


def test_class_token_pool():
    torch.manual_seed(0)
    net = tiny(pool="cls")
    torch.nn.init.normal_(net.head.weight)
    images = torch.randn(2, 1, 8, 8)
    tokens = net.features(images)
    assert tokens.shape == (2, 17, 16) and net.num_tokens == 17
    # learned positions for the class token too
    assert isinstance(net.positions.table, torch.nn.Parameter) and net.positions.table.shape == (17, 16)
    torch.testing.assert_close(net(images), net.head(tokens[:, 0]))
    with pytest.raises(ValueError, match="unknown pool"):
        tiny(pool="max")


def test_sinusoidal_2d_table_rows_and_columns():
    table = sinusoidal_table_2d(3, 4, 8).reshape(3, 4, 8)
    # first half of the channels depends only on the row, second half only on the column
    assert torch.equal(table[:, :1, :4].expand(3, 4, 4), table[..., :4])
    assert torch.equal(table[:1, :, 4:].expand(3, 4, 4), table[..., 4:])
    assert not torch.equal(table[0, 0], table[1, 0]) and not torch.equal(table[0, 0], table[0, 1])
    with pytest.raises(ValueError, match="divisible by 4"):
        sinusoidal_table_2d(2, 2, 6)


@pytest.mark.parametrize("kind", ["learned", "sinusoidal", "none"])
def test_position_kinds(kind):
    torch.manual_seed(0)
    net = tiny(pos=load_part("pos", kind))
    expected = {"learned": LearnedPositions, "sinusoidal": SinusoidalPositions, "none": NoPositions}[kind]
    assert type(net.positions) is expected
    assert (len(list(net.positions.parameters())) > 0) == (kind == "learned")  # only learned positions train
    images = torch.randn(1, 1, 8, 8)
    # swapping two patches: without positions the mean-pooled output is unchanged (a set function)
    swapped = images.clone()
    swapped[..., 0:2, 0:2], swapped[..., 6:8, 6:8] = images[..., 6:8, 6:8], images[..., 0:2, 0:2]
    same = torch.allclose(net.pool_features(net.features(images)), net.pool_features(net.features(swapped)),
                          atol=1e-5)
    assert same == (kind == "none")


@pytest.mark.parametrize("kind", ["rotary", "alibi"])
def test_sequence_positions_are_refused(kind):
    # 1-D sequence positions on a 2-D grid of patches: a setting the user chose, refused with one line
    message = f"pos={kind} is a 1-D sequence position.*use learned, sinusoidal or none"
    with pytest.raises(ConfigError, match=message) as e:
        tiny(pos=load_part("pos", kind))
    assert isinstance(e.value, UserError) and "\n" not in str(e.value)


def test_groups_reach_every_block():
    net = tiny(n_layers=3, norm=load_part("norm", "rms"), ffn=load_part("ffn", "swiglu"),
               moe=load_part("moe", "on", num_experts=4, top_k=2))
    assert len(net.encoder.layers) == 3
    for block in net.encoder.layers:
        assert isinstance(block, EncoderBlock) and block.pre_norm
        assert isinstance(block.sa_norm, torch.nn.RMSNorm) and isinstance(block.ffn_norm, torch.nn.RMSNorm)
        assert isinstance(block.ffn, MixtureOfExperts) and len(block.ffn.experts) == 4
        assert all(isinstance(e, FeedForward) and e.gate_proj is not None for e in block.ffn.experts)
    assert isinstance(net.encoder.final_norm, torch.nn.RMSNorm)
    assert net(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    post = tiny(norm=load_part("norm", "post"))
    assert not any(b.pre_norm for b in post.encoder.layers)
    assert isinstance(post.encoder.final_norm, torch.nn.Identity)


def test_attention_is_not_causal():
    net = tiny()
    from attnlab.modules.attention import capture_attention

    with torch.no_grad(), capture_attention(net) as maps:
        net(torch.randn(1, 1, 8, 8))
    w = maps["encoder.layers.0.self_attn"][0]  # (H, 16, 16)
    assert (w[:, 0, 1:] > 0).all()  # the first patch sees the later ones


def test_flops_per_token_counts_the_tokens():
    net = tiny()
    assert net.flops_per_token() > 6 * (net.active_params() - sum(p.numel() for p in net.head.parameters()))
    moe = tiny(moe=load_part("moe", "on", num_experts=4, top_k=1))
    assert moe.active_params() < moe.num_params()


def test_a_tiny_vit_overfits_a_small_batch():
    torch.manual_seed(0)
    net = tiny().train()
    images, labels = torch.randn(16, 1, 8, 8), torch.arange(16) % 10
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(net(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    assert (net.eval()(images).argmax(-1) == labels).all()
