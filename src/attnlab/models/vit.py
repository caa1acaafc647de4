"""Vision Transformer (Dosovitskiy et al. 2021; seed claim C12).

    image (B, C, H, W) -> patches (Conv2d, kernel = stride = patch) -> (B, N, D), row-major patch order
      (+ a class token) (+ positions) -> encoder: N non-causal layers -> final norm
      -> mean over the patch outputs (the seed's recipe; or the class token's output) -> linear -> logits (B, K)

The layers' norm, feed-forward, MoE and attention come from the ``norm``/``ffn``/``moe``/``attn`` config groups,
positions from ``pos``, built on the patch grid: ``learned`` (a trained table, as in ViT), ``sinusoidal`` (a fixed
2-D table: the first half of the channels encode the patch's row, the second half its column) or ``none`` (the model
is then a function of the *set* of patches). ``rotary`` and ``alibi`` are 1-D sequence positions and refuse a grid.
A sliding window (``attn.window=W``) is a band |i − j| < W over the row-major patch order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..core.errors import ConfigError
from ..modules.parts import BlockParts, resolve_positions
from ..modules.stack import build_stack
from .base import TransformerModel

POOLS = ("mean", "cls")


class PatchEmbedding(nn.Module):
    """(B, C, H, W) -> (B, N, D): each non-overlapping p×p patch flattened and projected (a strided Conv2d is exactly
    that linear map). Patch n is at row n // grid_w, column n % grid_w."""

    def __init__(self, image_size: int, patch_size: int, in_channels: int, d_model: int):
        super().__init__()
        if patch_size < 1 or image_size % patch_size:
            raise ConfigError(f"image_size={image_size} is not divisible by patch_size={patch_size}")
        self.image_size, self.patch_size = image_size, patch_size
        self.grid = image_size // patch_size
        self.num_patches = self.grid * self.grid
        self.proj = nn.Conv2d(in_channels, d_model, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: Tensor) -> Tensor:
        if images.shape[-2:] != (self.image_size, self.image_size):
            # the data and the model disagree (data.image_size vs model.net.image_size): a setting, not a bug
            raise ConfigError(f"expected {self.image_size}×{self.image_size} images, got {tuple(images.shape[-2:])}: "
                              f"the model was built for image_size={self.image_size}; give data.image_size and "
                              f"model.net.image_size the same value")
        return self.proj(images).flatten(2).transpose(1, 2)  # (B, D, gh, gw) -> (B, gh·gw, D)


class VisionTransformer(TransformerModel):
    def __init__(
        self,
        image_size: int = 8,
        patch_size: int = 2,
        in_channels: int = 1,
        num_classes: int = 10,
        d_model: int = 64,
        n_layers: int = 4,
        n_heads: int = 4,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
        bias: bool = True,
        # the block groups' parts (attnlab.modules.parts): a config with _target_, a built part, or None
        norm: Any = None, ffn: Any = None, moe: Any = None, attn: Any = None, pos: Any = None,
        pool: str = "mean",
        init: str = "xavier",
    ):
        super().__init__()
        if pool not in POOLS:
            raise ConfigError(f"unknown pool {pool!r}; choose one of {', '.join(POOLS)}")
        parts = BlockParts.resolve(norm, ffn, moe, attn)
        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        self.num_classes, self.d_model, self.n_layers, self.n_heads = num_classes, d_model, n_layers, n_heads
        self.pool = pool
        patch_embed = PatchEmbedding(image_size, patch_size, in_channels, d_model)
        self.grid = patch_embed.grid
        self.num_patches = patch_embed.num_patches
        self.prefix = 1 if pool == "cls" else 0  # tokens before the patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model)) if pool == "cls" else None
        # one row per token, the class token included (as in ViT); a fixed 2-D table gives the class token none
        self.positions = resolve_positions(pos)(max_len=self.num_tokens, d_model=d_model, n_heads=n_heads,
                                                grid=(self.grid, self.grid))
        # registered after the positions: the parameter order, which a saved optimizer state follows, puts the
        # position table first, as in the checkpoint layout where it is a parameter of the model itself
        self.patch_embed = patch_embed
        self.drop = nn.Dropout(dropout)
        self.encoder = build_stack(n_layers, d_model, n_heads, parts, dropout=dropout, attn_dropout=attn_dropout,
                                   bias=bias, positions=self.positions.attention)
        self.head = nn.Linear(d_model, num_classes)
        self.init_weights(init, zero_heads=(self.head,))  # ViT: the classifier starts at uniform predictions

    def lookup_tables(self) -> list[nn.Parameter]:
        return [*self.positions.parameters(), self.cls_token]

    def sequence_heads(self) -> list[nn.Module]:
        return [self.head]

    @property
    def num_tokens(self) -> int:
        """Sequence length inside the transformer: the patches, plus the class token with ``pool='cls'``."""
        return self.num_patches + self.prefix

    @property
    def default_seq_len(self) -> int:
        return self.num_tokens

    def embed(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) -> token embeddings (B, T, D) with positions, before the layers."""
        x = self.patch_embed(images)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)
        return self.drop(self.positions.add(x))

    def features(self, images: Tensor) -> Tensor:
        """images -> final normalized outputs of every token (B, T, D): one per patch (after the class token)."""
        return self.encoder(self.embed(images))  # non-causal: every patch attends to every patch

    def pool_features(self, tokens: Tensor) -> Tensor:
        """(B, T, D) -> (B, D): the mean of the patch outputs, or the class token's output."""
        if self.pool == "cls":
            return tokens[:, 0]
        return tokens.mean(dim=1)

    def forward(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) -> logits (B, num_classes)."""
        return self.head(self.pool_features(self.features(images)))
