"""Transformer-TTS (Li et al. 2019, "Neural Speech Synthesis with Transformer Network"): characters -> mel frames.

    text (B, N) -> embedding -> conv prenet (3 × conv5 + BN + ReLU) -> linear -> + α_enc · PE
      -> encoder: N non-causal layers (padding masked) -> final norm = memory (B, N, D)
    previous frames (B, G, M) -> decoder prenet (2-layer MLP, dropout ON at inference too) -> linear -> + α_dec · PE
      -> decoder: M layers (causal self-attention, cross-attention over memory) -> final norm (B, G, D)
      -> mel head (B, G, r·M) -> frames (B, G·r, M) ; + 5-layer conv postnet residual -> refined frames
      -> stop head (B, G, r) -> one stop logit per frame

``r`` is the reduction factor: each decoder step emits r frames, so the decoder runs G = ⌈T/r⌉ steps and its
attention has fewer, coarser rows (easier to align, faster). The input of step g is the last frame of group g−1
(zeros for g = 0). The prenet's dropout stays on at inference (Tacotron 2): without it the decoder leans on
the exact previous frame, which at inference is its own imperfect output. α are trainable scales of the sinusoidal
positions (the paper's "scaled positional encoding"), so the model can balance positions against content.

``text_eos`` (default on; ESPnet's Transformer-TTS and Tacotron 2 do the same): :meth:`TransformerTTS.encode` appends
``<eos>`` (:data:`~attnlab.core.special_tokens.CHAR_EOS_ID`) after each text's last character, so the text is N + 1 positions
long: once the characters are read, the decoder has a position to attend to (and to learn to stop on). Every
length the attention is measured against (guided attention's W, focus and diagonal rates) is then N + 1; the
forward pass returns it as ``text_lengths``. A net config without a ``text_eos`` key is built with it off
(:func:`~attnlab.checkpoints.upgrade.upgrade_net_config`): such a net was trained without ``<eos>``.

Layers come from the ``norm``/``ffn``/``moe``/``attn`` groups like every transformer here. Positions are fixed to
the scaled sinusoid (the ``pos`` group does not apply).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..modules.block import DecoderCache
from ..modules.parts import BlockParts
from ..modules.positional import sinusoidal_table
from ..modules.stack import build_stack
from ..core.special_tokens import CHAR_EOS_ID, char_text
from .base import TransformerModel


class ScaledPositions(nn.Module):
    """α · sinusoidal table, α trainable (initialized to 1)."""

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_len, dim), persistent=False)
        self.alpha = nn.Parameter(torch.ones(1))

    def forward(self, length: int, offset: int = 0) -> Tensor:  # (length, dim)
        if offset + length > self.table.shape[0]:
            raise ValueError(f"position {offset + length} beyond the position table ({self.table.shape[0]})")
        return self.alpha * self.table[offset : offset + length]


class ConvNormAct(nn.Sequential):
    """Conv1d over time (same length) + BatchNorm + activation + dropout; (B, C, T) -> (B, C', T)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, act: nn.Module | None, dropout: float):
        super().__init__(nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2), nn.BatchNorm1d(c_out),
                         act or nn.Identity(), nn.Dropout(dropout))


class EncoderPrenet(nn.Module):
    """(B, N) ids -> (B, N, D): embedding, ``n_convs`` convolutions (local character context), linear."""

    def __init__(self, vocab_size: int, d_model: int, n_convs: int = 3, kernel: int = 5, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.convs = nn.Sequential(*[ConvNormAct(d_model, d_model, kernel, nn.ReLU(), dropout) for _ in range(n_convs)])
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, text: Tensor, mask: Tensor) -> Tensor:
        x = self.embed(text).transpose(1, 2)  # (B, D, N)
        m = mask[:, None, :].to(x.dtype)
        for conv in self.convs:  # zero the padding before each conv so it cannot leak into real characters
            x = conv(x * m)
        return self.proj(x.transpose(1, 2))


class DecoderPrenet(nn.Module):
    """(B, G, M) frames -> (B, G, D): Linear-ReLU-Dropout ×2, then a projection to the model width.

    ``always_dropout``: dropout also in eval mode (see the module docstring); tests turn it off to compare
    incremental and teacher-forced decoding exactly.
    """

    def __init__(self, n_mels: int, hidden: int, d_model: int, dropout: float = 0.5, always_dropout: bool = True):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(n_mels, hidden), nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, d_model)
        self.dropout, self.always_dropout = dropout, always_dropout

    def forward(self, frames: Tensor) -> Tensor:
        on = self.training or self.always_dropout
        x = F.dropout(F.relu(self.fc1(frames)), self.dropout, on)
        x = F.dropout(F.relu(self.fc2(x)), self.dropout, on)
        return self.proj(x)


class Postnet(nn.Module):
    """(B, T, M) -> (B, T, M) correction: ``n_layers`` conv5 layers (tanh between, linear last), added by the caller."""

    def __init__(self, n_mels: int, channels: int = 256, n_layers: int = 5, kernel: int = 5, dropout: float = 0.1):
        super().__init__()
        dims = [n_mels] + [channels] * (n_layers - 1) + [n_mels]
        self.layers = nn.Sequential(*[
            ConvNormAct(dims[i], dims[i + 1], kernel, nn.Tanh() if i < n_layers - 1 else None, dropout)
            for i in range(n_layers)])

    def forward(self, mel: Tensor) -> Tensor:
        return self.layers(mel.transpose(1, 2)).transpose(1, 2)


class TransformerTTS(TransformerModel):
    def __init__(
        self,
        vocab_size: int,
        n_mels: int = 80,
        d_model: int = 128,
        n_heads: int = 4,
        n_encoder_layers: int = 3,
        n_decoder_layers: int = 3,
        reduction: int = 3,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
        bias: bool = True,
        enc_prenet_convs: int = 3,
        dec_prenet_dim: int = 128,
        dec_prenet_dropout: float = 0.5,
        prenet_always_dropout: bool = True,
        postnet_channels: int = 256,
        postnet_layers: int = 5,
        max_text_len: int = 256,
        max_dec_steps: int = 1024,
        text_eos: bool = True,
        # the block groups' parts (attnlab.modules.parts): a config with _target_, a built part, or None
        norm: Any = None, ffn: Any = None, moe: Any = None, attn: Any = None,
        n_layers: int | None = None,
        init: str = "xavier",
    ):
        """``n_layers``, when given, sets both stacks' depth (``debug=fast`` sets it for every model)."""
        super().__init__()
        if n_layers is not None:
            n_encoder_layers = n_decoder_layers = n_layers
        if reduction < 1:
            raise ValueError(f"reduction must be >= 1, got {reduction}")
        if text_eos and vocab_size <= CHAR_EOS_ID:
            raise ValueError(f"text_eos needs the <eos> id {CHAR_EOS_ID} in the vocabulary: "
                             f"vocab_size >= {CHAR_EOS_ID + 1} "
                             f"(got {vocab_size}), or text_eos=false")
        self.text_eos = bool(text_eos)
        self.vocab_size, self.n_mels, self.d_model, self.n_heads = vocab_size, n_mels, d_model, n_heads
        self.reduction, self.max_dec_steps, self.max_text_len = reduction, max_dec_steps, max_text_len
        parts = BlockParts.resolve(norm, ffn, moe, attn)
        common = dict(dropout=dropout, attn_dropout=attn_dropout, bias=bias)
        self.enc_prenet = EncoderPrenet(vocab_size, d_model, enc_prenet_convs, dropout=dropout)
        self.enc_pos = ScaledPositions(max_text_len, d_model)
        self.encoder = build_stack(n_encoder_layers, d_model, n_heads, parts, **common)
        self.dec_prenet = DecoderPrenet(n_mels, dec_prenet_dim, d_model, dec_prenet_dropout, prenet_always_dropout)
        self.dec_pos = ScaledPositions(max_dec_steps, d_model)
        self.decoder = build_stack(n_decoder_layers, d_model, n_heads, parts, cross_attention=True, **common)
        self.drop = nn.Dropout(dropout)
        self.mel_head = nn.Linear(d_model, reduction * n_mels)
        self.stop_head = nn.Linear(d_model, reduction)
        self.postnet = Postnet(n_mels, postnet_channels, postnet_layers, dropout=dropout)
        self.init_weights(init)

    def lookup_tables(self) -> list[nn.Parameter]:
        return [self.enc_prenet.embed.weight]

    @property
    def default_seq_len(self) -> int:
        return self.max_text_len

    @property
    def max_chars(self) -> int:
        """The longest text (characters) the model reads: its position table, less one for ``<eos>``."""
        return self.max_text_len - int(self.text_eos)

    def char_labels(self, text: Tensor, length: int) -> list[str]:
        """One label per position the attention reads of a (N,) text: its characters, then ``<eos>`` if appended."""
        return list(char_text(text[:length].tolist())) + (["<eos>"] if self.text_eos else [])

    # --- pieces -----------------------------------------------------------------------------------------------
    def append_eos(self, text: Tensor, text_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """(B, N) text, lengths -> (B, N + 1) with ``<eos>`` right after each text's last character, lengths + 1
        (unchanged without ``text_eos``)."""
        if not self.text_eos:
            return text, text_lengths
        text = F.pad(text, (0, 1), value=0).scatter(1, text_lengths[:, None].long(), CHAR_EOS_ID)
        return text, text_lengths + 1

    def encode(self, text: Tensor, text_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """text (B, N) -> memory (B, N', D), mask (B, N') True = real character or ``<eos>``; N' = N + 1 with
        ``text_eos``, else N."""
        text, text_lengths = self.append_eos(text, text_lengths)
        mask = torch.arange(text.shape[1], device=text.device)[None] < text_lengths[:, None]
        x = self.enc_prenet(text, mask)
        x = self.drop(x + self.enc_pos(x.shape[1]))
        return self.encoder(x, padding_mask=mask), mask

    def decoder_inputs(self, mel: Tensor) -> Tensor:
        """Teacher forcing: (B, T, M) target frames -> (B, G, M) inputs, the last frame of each previous group."""
        b, t, m = mel.shape
        g = -(-t // self.reduction)
        last = mel.new_zeros(b, g, m)
        if g > 1:
            last[:, 1:] = mel[:, self.reduction - 1 :: self.reduction][:, : g - 1]
        return last

    def decode(self, frames: Tensor, memory: Tensor, memory_mask: Tensor,
               caches: list[DecoderCache] | None = None) -> Tensor:
        """frames (B, G, M) -> hidden (B, G, D); with ``caches`` the G frames follow the cached steps."""
        return self.decoder(self._decoder_stream(frames, caches), memory=memory, memory_padding_mask=memory_mask,
                            is_causal=True, caches=caches)

    def _decoder_stream(self, frames: Tensor, caches: list[DecoderCache] | None) -> Tensor:
        """frames (B, G, M) -> the decoder's input (B, G, D): prenet + positions after the cached steps."""
        offset = caches[0].self_attn.length if caches else 0
        return self.drop(self.dec_prenet(frames) + self.dec_pos(frames.shape[1], offset))

    def decode_with_attention(self, frames: Tensor, memory: Tensor | None, memory_mask: Tensor, layers,
                              caches: list[DecoderCache] | None = None) -> tuple[Tensor, dict[int, Tensor]]:
        """:meth:`decode`, also returning the cross-attention weights (B, H, G, N) of the decoder ``layers`` listed
        (negative: from the last), keyed by layer index; only those take the explicit attention path."""
        return self.decoder.forward_with_cross_weights(self._decoder_stream(frames, caches), layers, memory=memory, memory_padding_mask=memory_mask,
                                                       is_causal=True, caches=caches)

    def project(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """hidden (B, G, D) -> frames (B, G·r, M) before the postnet, stop logits (B, G·r)."""
        b, g, _ = hidden.shape
        return self.mel_head(hidden).view(b, g * self.reduction, self.n_mels), self.stop_head(hidden).view(b, -1)

    def refine(self, mel: Tensor) -> Tensor:
        """The postnet's residual correction: (B, T, M) -> (B, T, M)."""
        return mel + self.postnet(mel)

    def new_caches(self, batch: int, text_len: int, max_steps: int, dtype=None, device=None) -> list[DecoderCache]:
        return self.decoder.new_caches(batch, max_steps, memory_len=text_len, dtype=dtype, device=device)

    # --- teacher-forced forward ---------------------------------------------------------------------------------
    def forward(self, text: Tensor, text_lengths: Tensor, mel: Tensor, mel_lengths: Tensor | None = None,
                attention_layers: tuple[int, ...] | list[int] = ()) -> dict[str, Tensor]:
        """Teacher-forced pass.

        Returns ``mel_before``/``mel_after`` (B, G·r, M), ``stop_logits`` (B, G·r), ``dec_lengths`` (B,) steps
        per utterance (⌈T_b / r⌉), ``text_lengths`` (B,) the positions the attention reads (characters, + 1 for
        ``<eos>`` with ``text_eos``), and ``attention``: the cross-attention weights (B, H, G, N') of the decoder
        layers listed in ``attention_layers`` (only those take the explicit attention path).
        """
        memory, mask = self.encode(text, text_lengths)
        hidden, weights = self.decode_with_attention(self.decoder_inputs(mel), memory, mask, attention_layers)
        attention = [weights[i] for i in sorted(weights)]
        before, stop = self.project(hidden)
        if mel_lengths is None:
            mel_lengths = torch.full((mel.shape[0],), mel.shape[1], device=mel.device)
        return {"mel_before": before, "mel_after": self.refine(before), "stop_logits": stop,
                "dec_lengths": -(-mel_lengths // self.reduction), "text_lengths": mask.sum(1), "attention": attention}
