"""Vision Transformer (Dosovitskiy et al. 2021; seed claim C12).

    image (B, C, H, W) -> patches (Conv2d, kernel = stride = patch) -> (B, N, D), row-major patch order
      (+ a class token) (+ positions) -> N × EncoderBlock (non-causal) -> final norm
      -> mean over the patch outputs (the seed's recipe; or the class token's output) -> linear -> logits (B, K)

The blocks' norm, feed-forward and MoE come from the ``norm``/``ffn``/``moe`` config groups, positions from ``pos``:
``learned`` (a trained table, as in ViT), ``sinusoidal`` (a fixed 2-D table: the first half of the channels encode
the patch's row, the second half its column) or ``none`` (the model is then a function of the *set* of patches).
``rotary`` is a 1-D sequence position inside attention and is refused here.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..modules.block import build_block, build_final_norm
from ..modules.moe import moe_layers
from ..modules.positional import sinusoidal_table
from ..modules.spec import FFNSpec, MoESpec, NormSpec, PosSpec
from ..utils.config import ConfigError

POOLS = ("mean", "cls")
VIT_POSITIONS = ("learned", "sinusoidal", "none")


def sinusoidal_table_2d(grid_h: int, grid_w: int, dim: int) -> Tensor:
    """(grid_h·grid_w, dim) in row-major patch order: channels [0, dim/2) encode the row, [dim/2, dim) the column."""
    if dim % 4:
        raise ConfigError(f"2-D sinusoidal positions need d_model divisible by 4, got {dim}")
    half = dim // 2
    rows = sinusoidal_table(grid_h, half)  # (gh, D/2)
    cols = sinusoidal_table(grid_w, half)  # (gw, D/2)
    return torch.cat([rows[:, None, :].expand(grid_h, grid_w, half),
                      cols[None, :, :].expand(grid_h, grid_w, half)], dim=-1).reshape(grid_h * grid_w, dim)


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


class VisionTransformer(nn.Module):
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
        norm: NormSpec | dict | None = None,
        ffn: FFNSpec | dict | None = None,
        moe: MoESpec | dict | None = None,
        pos: PosSpec | dict | None = None,
        pool: str = "mean",
        scaled: bool = True,
    ):
        super().__init__()
        self.norm_spec, self.pos_spec = NormSpec.from_cfg(norm), PosSpec.from_cfg(pos)
        if pool not in POOLS:
            raise ConfigError(f"unknown pool {pool!r}; choose one of {', '.join(POOLS)}")
        if self.pos_spec.kind not in VIT_POSITIONS:
            raise ConfigError(
                f"pos={self.pos_spec.name} (kind {self.pos_spec.kind!r}) is not meaningful for the Vision Transformer: "
                f"rotary rotates by a 1-D sequence position, patches sit on a 2-D grid; use one of "
                f"{', '.join(VIT_POSITIONS)}")
        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        self.num_classes, self.d_model, self.n_layers, self.n_heads = num_classes, d_model, n_layers, n_heads
        self.pool = pool
        self.patch_embed = PatchEmbedding(image_size, patch_size, in_channels, d_model)
        self.grid = self.patch_embed.grid
        self.num_patches = self.patch_embed.num_patches
        self.prefix = 1 if pool == "cls" else 0  # tokens before the patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model)) if pool == "cls" else None

        kind = self.pos_spec.kind
        self.pos_embed: nn.Parameter | None = None
        if kind == "learned":  # one row per token, the class token included (as in ViT)
            self.pos_embed = nn.Parameter(torch.randn(1, self.num_tokens, d_model) * 0.02)
        elif kind == "sinusoidal":  # fixed 2-D table for the patches; the class token gets none
            table = sinusoidal_table_2d(self.grid, self.grid, d_model)
            table = torch.cat([torch.zeros(self.prefix, d_model), table])[None]
            self.register_buffer("pos_table", table, persistent=False)

        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            build_block(d_model, n_heads, norm=norm, ffn=ffn, moe=moe, dropout=dropout,
                        attn_dropout=attn_dropout, bias=bias, scaled=scaled)
            for _ in range(n_layers)
        )
        self.final_norm = build_final_norm(norm, d_model)
        self.head = nn.Linear(d_model, num_classes)
        self.apply(self._init_weights)
        nn.init.zeros_(self.head.weight)  # ViT: the classifier starts at uniform predictions
        nn.init.zeros_(self.head.bias)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """Xavier-uniform matrices, zero biases (the original ViT's JAX init). GPT's fixed std 0.02 is made for
        d ≈ 768; at the small widths a CPU trains (d = 64) it starts every attention map uniform and every
        sublayer near zero, and measured on digits it learned ~2× slower."""
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Conv2d):  # the patch projection, initialized as the linear map it is
            nn.init.xavier_uniform_(module.weight.view(module.weight.shape[0], -1))
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    @property
    def num_tokens(self) -> int:
        """Sequence length inside the transformer: the patches, plus the class token with ``pool='cls'``."""
        return self.num_patches + self.prefix

    def embed(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) -> token embeddings (B, T, D) with positions, before the blocks."""
        x = self.patch_embed(images)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        elif self.pos_spec.kind == "sinusoidal":
            x = x + self.pos_table.to(x.dtype)
        return self.drop(x)

    def features(self, images: Tensor) -> Tensor:
        """images -> final normalized outputs of every token (B, T, D): one per patch (after the class token)."""
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)  # non-causal: every patch attends to every patch
        return self.final_norm(x)

    def pool_features(self, tokens: Tensor) -> Tensor:
        """(B, T, D) -> (B, D): the mean of the patch outputs, or the class token's output."""
        if self.pool == "cls":
            return tokens[:, 0]
        return tokens.mean(dim=1)

    def forward(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) -> logits (B, num_classes)."""
        return self.head(self.pool_features(self.features(images)))

    # --- sizes, for scaling plots and MFU ---------------------------------------------------------------------
    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters; without the position table and class token (``non_embedding``)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            for p in (self.pos_embed, self.cls_token):
                n -= p.numel() if p is not None else 0
        return n

    def active_params(self) -> int:
        """Non-embedding parameters a token passes through (MoE: router + top-k of E experts)."""
        n = self.num_params(non_embedding=True)
        for m in moe_layers(self):
            n -= sum(p.numel() for p in m.experts[0].parameters()) * (m.num_experts - m.top_k)
        return n

    def flops_per_token(self) -> float:
        """Training FLOPs (forward + backward) per token: 6·N_active + 12·L·d·T, with T = ``num_tokens``.

        The head runs once per image, not per token: its 6·d·K is spread over the T tokens.
        """
        head = sum(p.numel() for p in self.head.parameters())
        t = self.num_tokens
        return 6 * (self.active_params() - head) + 6 * head / t + 12 * self.n_layers * self.d_model * t
