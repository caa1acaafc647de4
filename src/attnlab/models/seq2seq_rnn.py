"""RNN encoder-decoder for translation, with or without attention (seed claims C1, C2, C23, C24).

Encoder: embeddings -> bidirectional GRU/LSTM (``d_hidden / 2`` per direction, so its outputs ``h_j`` are
``d_hidden`` wide like the decoder state, which ``luong_dot`` needs). Padded batches are *packed*, so a row's
states never see padding: the backward direction starts at the row's own last token (tested: padding a batch
does not change a row's result). The decoder's initial state is ``s_0 = tanh(W_b [h→_last; h←_first])`` per layer.

Decoder, one step at a time (teacher forcing, scheduled sampling and incremental decoding share :meth:`step`):

* ``attention="none"`` (C1, Cho et al. 2014): one fixed context ``c = tanh(W_c [h→_last; h←_first])`` (the top
  layer's final states, whatever the input length: the information bottleneck of claim E1), fed at every step:
  ``s_t = RNN([y_{t-1}; c], s_{t-1})``, readout ``r_t = tanh(W_o [s_t; c; y_{t-1}])``. No attention module.
* ``bahdanau`` (C2): ``c_t = Σ_j a_tj h_j`` with ``a_t = softmax_j(v·tanh(W s_{t-1} + U h_j))``, then
  ``s_t = RNN([y_{t-1}; c_t], s_{t-1})`` and ``r_t = tanh(W_o [s_t; c_t; y_{t-1}])`` (Bahdanau's maxout readout
  simplified to tanh).
* ``luong_dot`` / ``luong_general`` (Luong et al. 2015, with input feeding): ``s_t = RNN([y_{t-1}; r_{t-1}],
  s_{t-1})``, ``c_t`` from attention on the *current* ``s_t``, ``r_t = tanh(W_c [c_t; s_t])`` (their h̃_t).

Output: ``logits = E_out r_t``; ``r_t`` is ``d_emb`` wide so that ``tie_embeddings`` can share one matrix between
the encoder's and decoder's embeddings and the output layer (the vocabulary is joint).

Copy (C24, pointer-generator, See et al. 2017): ``p_gen = σ(w·[c_t; s_t; y_{t-1}] + b)`` and
``P = p_gen·softmax(logits) + (1 − p_gen)·Σ_j a_tj·onehot(src_j)``; the net then returns ``log P`` (clamped), a
normalized log-distribution, which ``cross_entropy``'s log_softmax leaves unchanged. There is no extended
vocabulary: the data's tokenizer is a joint *byte-level* BPE, so every source token (a never-seen name included,
as byte pieces) already has an id in the vocabulary, and copying it is scattering its attention weight there.

Scheduled sampling (C23) is per step (``per_step_sampling = True``): with ``sampling_ratio`` r > 0, at each step
t ≥ 1 each row feeds the argmax of its own previous scores instead of ``tgt_in[:, t]`` with probability r.
r = 0 draws no random numbers at all, so it is teacher forcing exactly (same numbers, same RNG stream).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..core.choices import RNN_ATTENTIONS, RNN_CELLS
from attnlab.modules.rnn_attention import RNNAttention

CELLS = dict(zip(RNN_CELLS, (nn.GRU, nn.LSTM), strict=True))
ATTENTIONS = RNN_ATTENTIONS
COPY_EPS = 1e-10  # floor of the copy mixture's probabilities before the log (a token neither generated nor in src)

Hidden = Tensor | tuple[Tensor, Tensor]  # GRU: h (L, B, D); LSTM: (h, c)


def _select(x, index: Tensor, dim: int):
    """index_select over a tensor, a (h, c) pair or None."""
    if x is None:
        return None
    if isinstance(x, tuple):
        return tuple(t.index_select(dim, index) for t in x)
    return x.index_select(dim, index)


def _top(hidden: Hidden) -> Tensor:
    """The top layer's state s (B, D) (an LSTM's h, not its cell state)."""
    return (hidden[0] if isinstance(hidden, tuple) else hidden)[-1]


@dataclass
class Memory:
    """What the decoder reads from the encoder, per sentence (beam search reorders its rows)."""

    states: Tensor  # (B, S, D) encoder outputs h_j (zeros at padding)
    mask: Tensor  # (B, S) bool, True at real source tokens
    src: Tensor  # (B, S) source ids (the copy distribution scatters onto them)
    keys: Tensor | None  # (B, S, ·) the attention's step-independent projection of `states`; None without attention
    fixed: Tensor | None  # (B, D) attention="none": the fixed context vector c

    def index_select(self, index: Tensor) -> "Memory":
        return Memory(*(_select(getattr(self, f.name), index, 0) for f in fields(self)))


@dataclass
class DecoderState:
    hidden: Hidden  # (L, B, D) [and the LSTM cell state]
    feed: Tensor | None  # (B, d_emb) Luong's input feeding: the previous readout r_{t-1}; None otherwise

    def index_select(self, index: Tensor) -> "DecoderState":
        return DecoderState(_select(self.hidden, index, 1), _select(self.feed, index, 0))


class RNNEncoder(nn.Module):
    def __init__(self, embedding: nn.Embedding, d_hidden: int, n_layers: int, cell: str, dropout: float):
        super().__init__()
        self.embedding, self.dropout = embedding, nn.Dropout(dropout)
        self.rnn = CELLS[cell](embedding.embedding_dim, d_hidden // 2, n_layers, batch_first=True,
                               bidirectional=True, dropout=dropout if n_layers > 1 else 0.0)  # fmt: skip

    def forward(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Hidden]:
        """src, src_mask (B, S) -> outputs (B, S, D) (zeros at padding), final states per layer (L, B, D)."""
        B, S = src.shape
        lengths = src_mask.sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("every source row needs at least one real token (src_mask all False in some row)")
        x = self.dropout(self.embedding(src))
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, final = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=S)

        def merge(h: Tensor) -> Tensor:  # (L·2, B, D/2) -> (L, B, D): each layer's [forward last; backward first]
            return h.view(-1, 2, B, h.shape[-1]).transpose(1, 2).reshape(-1, B, 2 * h.shape[-1])

        return out, (tuple(merge(h) for h in final) if isinstance(final, tuple) else merge(final))


class RNNDecoder(nn.Module):
    def __init__(self, embedding: nn.Embedding, vocab_size: int, d_hidden: int, n_layers: int, cell: str,
                 attention: str, dropout: float, tie_embeddings: bool, copy: bool):  # fmt: skip
        super().__init__()
        d_emb = embedding.embedding_dim
        self.attention, self.copy = attention, copy
        self.luong = attention.startswith("luong")
        self.embedding, self.dropout = embedding, nn.Dropout(dropout)
        feed = d_emb if self.luong else d_hidden  # Luong: r_{t-1}; Bahdanau: c_t; none: the fixed c
        self.rnn = CELLS[cell](d_emb + feed, d_hidden, n_layers, batch_first=True,
                               dropout=dropout if n_layers > 1 else 0.0)  # fmt: skip
        if attention != "none":
            self.cross_attn = RNNAttention(attention, d_query=d_hidden, d_memory=d_hidden)
        # Luong: r = tanh(W_c [c; s]); Bahdanau / none: r = tanh(W_o [s; c; y_{t-1}])
        self.readout = nn.Linear(2 * d_hidden if self.luong else 2 * d_hidden + d_emb, d_emb)
        self.out = nn.Linear(d_emb, vocab_size)
        if tie_embeddings:
            self.out.weight = embedding.weight
        if copy:
            self.p_gen = nn.Linear(2 * d_hidden + d_emb, 1)

    def initial_feed(self, batch: int, like: Tensor) -> Tensor | None:
        return like.new_zeros(batch, self.embedding.embedding_dim) if self.luong else None

    def step(self, y_prev: Tensor, mem: Memory, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """One decoder step: previous tokens y_prev (B,) -> scores (B, V) for the next token, new state."""
        e = self.dropout(self.embedding(y_prev))  # (B, d_emb)
        weights = None
        if self.attention == "bahdanau":  # attends with the previous state s_{t-1} (C2)
            ctx, weights = self.cross_attn(_top(state.hidden), mem.states, mem.mask, mem.keys)
            x = torch.cat([e, ctx], dim=-1)
        elif self.attention == "none":
            ctx = mem.fixed
            x = torch.cat([e, ctx], dim=-1)
        else:
            x = torch.cat([e, state.feed], dim=-1)
        out, hidden = self.rnn(x[:, None, :], state.hidden)
        s = out[:, 0]  # (B, D)
        if self.luong:  # attends with the current state s_t
            ctx, weights = self.cross_attn(s, mem.states, mem.mask, mem.keys)
            r = torch.tanh(self.readout(torch.cat([ctx, s], dim=-1)))
        else:
            r = torch.tanh(self.readout(torch.cat([s, ctx, e], dim=-1)))
        logits = self.out(self.dropout(r))  # (B, V)
        new_state = DecoderState(hidden, r if self.luong else None)
        if not self.copy:
            return logits, new_state
        p_gen = torch.sigmoid(self.p_gen(torch.cat([ctx, s, e], dim=-1)))  # (B, 1)
        copy = torch.zeros_like(logits).scatter_add(1, mem.src, (1 - p_gen) * weights)  # (B, V); pads get 0
        probs = p_gen * logits.softmax(dim=-1) + copy
        return probs.clamp_min(COPY_EPS).log(), new_state


class Seq2SeqRNN(nn.Module):
    """Bidirectional GRU/LSTM encoder, GRU/LSTM decoder, no / Bahdanau / Luong attention, optional copy.

    See the module docstring for the equations. ``forward`` gives teacher-forced (or scheduled-sampled) scores
    (B, T, V): logits, or log-probabilities with ``copy``; ``stepper`` decodes incrementally for
    :func:`attnlab.decoding.beam_search`.
    """

    per_step_sampling = True  # the task passes sampling_ratio to forward; this net samples step by step

    def __init__(self, vocab_size: int, d_emb: int = 128, d_hidden: int = 256, n_layers: int = 1,
                 cell: str = "gru", attention: str = "bahdanau", dropout: float = 0.1,
                 tie_embeddings: bool = True, copy: bool = False, pad_id: int = 0, d_model: int | None = None,
                 n_heads: int | None = None):  # fmt: skip
        """``d_model`` (if given) replaces ``d_hidden`` and ``n_heads`` is ignored (an RNN attends with one head):
        both are accepted so that the presets that size every model's net (``debug=fast``) apply here too."""
        super().__init__()
        d_hidden = d_model if d_model is not None else d_hidden
        if cell not in CELLS:
            raise ValueError(f"unknown cell {cell!r}; valid cells: {', '.join(CELLS)}")
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}; valid: {', '.join(ATTENTIONS)}")
        if copy and attention == "none":
            raise ValueError("copy=true needs an attention (the copy distribution is the attention over the source); "
                             "attention=none has none")  # fmt: skip
        if d_hidden % 2:
            raise ValueError(f"d_hidden must be even (the bidirectional encoder uses d_hidden/2 per direction), "
                             f"got {d_hidden}")  # fmt: skip
        self.vocab_size, self.attention, self.cell, self.copy = vocab_size, attention, cell, copy
        src_emb = nn.Embedding(vocab_size, d_emb, padding_idx=pad_id)
        tgt_emb = src_emb if tie_embeddings else nn.Embedding(vocab_size, d_emb, padding_idx=pad_id)
        self.encoder = RNNEncoder(src_emb, d_hidden, n_layers, cell, dropout)
        self.decoder = RNNDecoder(tgt_emb, vocab_size, d_hidden, n_layers, cell, attention, dropout,
                                  tie_embeddings, copy)  # fmt: skip
        self.bridge = nn.Linear(d_hidden, d_hidden)  # encoder final states -> decoder initial state s_0
        if cell == "lstm":
            self.bridge_cell = nn.Linear(d_hidden, d_hidden)
        if attention == "none":
            self.context = nn.Linear(d_hidden, d_hidden)  # the fixed context vector c

    @property
    def cross_attn(self) -> RNNAttention | None:
        return getattr(self.decoder, "cross_attn", None)

    def encode(self, src: Tensor, src_mask: Tensor) -> tuple[Memory, DecoderState]:
        """src, src_mask (B, S) -> the decoder's memory and its initial state."""
        states, final = self.encoder(src, src_mask)
        if isinstance(final, tuple):
            h, c = final
            hidden: Hidden = (torch.tanh(self.bridge(h)).contiguous(), self.bridge_cell(c).contiguous())
        else:
            h = final
            hidden = torch.tanh(self.bridge(h)).contiguous()
        attn = self.cross_attn
        mem = Memory(
            states=states, mask=src_mask, src=src,
            keys=attn.project_memory(states) if attn is not None else None,
            fixed=torch.tanh(self.context(h[-1])) if self.attention == "none" else None,
        )  # fmt: skip
        return mem, DecoderState(hidden, self.decoder.initial_feed(src.shape[0], states))

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, sampling_ratio: float = 0.0) -> Tensor:
        """src, src_mask (B, S), tgt_in (B, T) (<bos> + target) -> scores (B, T, V) for tgt_out."""
        if not 0.0 <= sampling_ratio <= 1.0:
            raise ValueError(f"sampling_ratio must be in [0, 1], got {sampling_ratio}")
        mem, state = self.encode(src, src_mask)
        if self.cross_attn is not None:
            self.cross_attn.reset_weights()
        scores: list[Tensor] = []
        for t in range(tgt_in.shape[1]):
            y = tgt_in[:, t]
            if t > 0 and sampling_ratio > 0:  # r = 0 draws nothing: exactly teacher forcing
                own = scores[-1].detach().argmax(dim=-1)
                y = torch.where(torch.rand(y.shape, device=y.device) < sampling_ratio, own, y)
            step_scores, state = self.decoder.step(y, mem, state)
            scores.append(step_scores)
        return torch.stack(scores, dim=1)

    def stepper(self, src: Tensor, src_mask: Tensor, use_cache: bool = True) -> "Seq2SeqRNNStepper":
        return Seq2SeqRNNStepper(self, src, src_mask, use_cache)


class Seq2SeqRNNStepper:
    """Incremental decoding (the :class:`~attnlab.decoding.step.Stepper` protocol) of a :class:`Seq2SeqRNN`.

    The source is encoded once here. use_cache=True carries the decoder state from step to step (one RNN step per
    token); use_cache=False re-runs the decoder over the whole prefix from the initial state every step (the
    reference the incremental path must match). ``reorder`` selects rows of everything per sentence: memory,
    initial and current state, tokens, and attention weights being captured.
    """

    def __init__(self, net: Seq2SeqRNN, src: Tensor, src_mask: Tensor, use_cache: bool = True):
        self.net, self.use_cache = net, use_cache
        self.mem, self.initial = net.encode(src, src_mask)
        self.state: DecoderState | None = None
        self.tokens: Tensor | None = None  # (B, t) the prefix and every token stepped so far

    def _run(self, tokens: Tensor) -> Tensor:
        attn = self.net.cross_attn
        if attn is not None:
            attn.reset_weights()
        state = self.initial
        for t in range(tokens.shape[1]):
            scores, state = self.net.decoder.step(tokens[:, t], self.mem, state)
        self.state = state
        return scores

    def prefill(self, prefix: Tensor) -> Tensor:
        """prefix (B, t), starting with <bos> -> scores (B, V) of the token after it."""
        if prefix.shape[0] != self.mem.src.shape[0]:
            raise ValueError(f"prefix has {prefix.shape[0]} rows, the source {self.mem.src.shape[0]}")
        self.tokens = prefix
        return self._run(prefix)

    def step(self, token: Tensor) -> Tensor:
        """token (B,) -> scores (B, V) of the next one."""
        self.tokens = torch.cat([self.tokens, token[:, None]], dim=1)
        if not self.use_cache:
            return self._run(self.tokens)
        scores, self.state = self.net.decoder.step(token, self.mem, self.state)
        return scores

    def reorder(self, index: Tensor) -> None:
        self.mem = self.mem.index_select(index)
        self.initial = self.initial.index_select(index)
        self.state = self.state.index_select(index) if self.state is not None else None
        self.tokens = self.tokens.index_select(0, index) if self.tokens is not None else None
        attn = self.net.cross_attn
        if attn is not None and attn.weights is not None:
            attn.weights = attn.weights.index_select(0, index)
