"""A causal language model's weights in a Hugging Face ``transformers`` layout (GPT-2, LLaMA, Qwen3: LLaMA's with
``q_norm``/``k_norm``, Mixtral: LLaMA's with a mixture of SwiGLU experts), chosen by its parts, a ViT's as
``ViTForImageClassification`` (class-token pooling, learned positions) and a masked language model's as
``BertForMaskedLM`` (post-norm, BERT's embedding norm, token types and head transform): the tables below.

Which layout a model can take is decided from its net config alone (the parts the config groups built), so a model
whose parts have no counterpart is refused, naming the part and the layouts that part fits, before anything is
written. The weights are renamed and reshaped, never changed:

    attnlab (CausalLM)                          GPT-2 (GPT2LMHeadModel)          LLaMA (LlamaForCausalLM)
    embed.weight                                transformer.wte.weight           model.embed_tokens.weight
    positions.table                             transformer.wpe.weight           (rotary: no weights)
    decoder.layers.i.sa_norm                    transformer.h.i.ln_1             model.layers.i.input_layernorm
    decoder.layers.i.self_attn.qkv_proj         h.i.attn.c_attn (transposed:     self_attn.q_proj | k_proj | v_proj
      (rows q | k | v; kv_heads' rows for k, v)   GPT-2's Conv1D is x @ W)         (split by rows)
    decoder.layers.i.self_attn.out_proj         h.i.attn.c_proj (transposed)     self_attn.o_proj
    decoder.layers.i.ffn_norm                   transformer.h.i.ln_2             post_attention_layernorm
    decoder.layers.i.ffn.up_proj                h.i.mlp.c_fc (transposed)        mlp.up_proj
    decoder.layers.i.ffn.gate_proj              (none: not gated)                mlp.gate_proj
    decoder.layers.i.ffn.down_proj              h.i.mlp.c_proj (transposed)      mlp.down_proj
    decoder.final_norm                          transformer.ln_f                 model.norm
    head.weight                                 lm_head.weight (untied only)     lm_head.weight (untied only)

No q/k permutation is needed for LLaMA: attnlab's rotary embedding rotates the two halves of each head
(``rotate_half``, as ``transformers`` does), not interleaved pairs (Meta's original layout). Grouped-query heads
line up as they are: query head h reads key/value head ``h // (n_heads / kv_heads)`` in both.
"""

from __future__ import annotations

from typing import Any

LAYOUTS = ("gpt2", "llama", "qwen3", "mixtral", "vit", "bert")
MOE = "attnlab.modules.moe.mixture_of_experts"
CAUSAL_LM, VIT = "attnlab.models.causal_lm.CausalLM", "attnlab.models.vit.VisionTransformer"
MASKED_LM = "attnlab.models.masked_lm.MaskedLM"
NET_OF = {"gpt2": CAUSAL_LM, "llama": CAUSAL_LM, "qwen3": CAUSAL_LM, "mixtral": CAUSAL_LM, "vit": VIT,
          "bert": MASKED_LM}  # its net
STACK = {"gpt2": "decoder", "llama": "decoder", "qwen3": "decoder", "mixtral": "decoder", "vit": "encoder",
         "bert": "encoder"}
LAYER_NORMS = {"torch.nn.LayerNorm"}
RMS_NORMS = {"attnlab.modules.norm.RMSNorm", "torch.nn.RMSNorm"}
LEARNED, ROTARY = "attnlab.modules.positional.LearnedPositions", "attnlab.modules.positional.RotaryPositions"
# an activation class (with its arguments) -> transformers' name for it (ACT2FN)
ACTIVATIONS = {("torch.nn.GELU", "none"): "gelu", ("torch.nn.GELU", "tanh"): "gelu_new",
               ("torch.nn.ReLU", None): "relu", ("torch.nn.SiLU", None): "silu"}
# the masked LM's head transform activation (models.masked_lm.HEAD_ACTIVATIONS) -> transformers' name
HEAD_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def _target(node: Any) -> str | None:
    return node.get("_target_") if isinstance(node, dict) else None


def _activation(ffn: dict) -> str | None:
    act = ffn.get("activation") or {}
    target = _target(act)
    return ACTIVATIONS.get((target, act.get("approximate", "none") if target == "torch.nn.GELU" else None))


def misfits(net: dict, layout: str) -> list[str]:
    """Why the net ``net`` does not fit ``layout``: one phrase per part, empty when it fits."""
    if layout not in LAYOUTS:
        raise ValueError(f"no layout {layout!r}")
    if _target(net) != NET_OF[layout]:
        return [f"the net is {str(_target(net)).rsplit('.', 1)[-1]}, not {NET_OF[layout].rsplit('.', 1)[-1]}"]
    norm, ffn, attn, pos = (net.get(k) or {} for k in ("norm", "ffn", "attn", "pos"))
    out = []
    if not net.get("causal", True):
        out.append("model.net.causal=false (the layout masks the future)")
    if layout == "bert" and norm.get("placement", "pre") != "post":
        out.append(f"norm={norm.get('placement', 'pre')} (BERT normalizes after each residual: norm=post)")
    elif layout != "bert" and norm.get("placement", "pre") != "pre":
        out.append(f"norm={norm.get('placement')} (the layout normalizes before each sublayer)")
    moe = net.get("moe") or {}
    if moe and layout != "mixtral":
        out.append("moe=on")
    if layout == "mixtral":  # LLaMA's parts, the feed-forward a mixture of SwiGLU experts, no biases
        if _target(moe) != MOE:
            out.append("moe=off (Mixtral's feed-forward is a mixture of experts)")
        elif int(moe.get("top_k", 2)) < 2:
            out.append("moe.top_k=1 (attnlab keeps the raw probability at k=1, Mixtral renormalizes it to 1)")
        if net.get("bias", True) or ffn.get("bias"):
            out.append("biases (Mixtral has none: model.net.bias=false)")
    if attn.get("window"):
        out.append(f"attn.window={attn['window']}")
    if attn.get("qk_norm") and layout != "qwen3":
        out.append("attn.qk_norm=true")
    if attn.get("scaled") is False:
        out.append("attn.scaled=false")
    layer, gated, act = _target(norm.get("layer")), bool(ffn.get("gated")), _activation(ffn)
    if act is None:
        out.append(f"ffn.activation={_target(ffn.get('activation'))}")
    if layout == "gpt2":
        out += _original_transformer("GPT-2", net, layer, gated)
    elif layout in ("llama", "qwen3", "mixtral"):
        if layout == "qwen3":  # LLaMA's parts with RMSNorm on q and k, of the same epsilon as every other norm
            eps = (norm.get("layer") or {}).get("eps")
            if not attn.get("qk_norm"):
                out.append("attn.qk_norm=false (Qwen3 normalizes q and k)")
            elif attn.get("qk_norm_eps") != eps:
                out.append(f"attn.qk_norm_eps={attn.get('qk_norm_eps')} (Qwen3: the norms' eps, {eps})")
            if ffn.get("bias"):
                out.append("ffn.bias=true (Qwen3's MLP has no biases)")
        if layer not in RMS_NORMS:
            out.append(f"norm.layer={layer} (LLaMA: RMSNorm)")
        if not gated:
            out.append("ffn not gated (LLaMA: down(act(gate(x)) * up(x)))")
        if _target(pos) != ROTARY:
            out.append(f"pos={str(_target(pos)).rsplit('.', 1)[-1]} (LLaMA: rotary)")
    elif layout == "bert":  # BertForMaskedLM: its embedding norm, one token type, the head's transform and bias
        out += _original_transformer("BERT", net, layer, gated)
        for key, want in (("embed_norm", "true"), ("head_bias", "true")):
            if not net.get(key):
                out.append(f"model.net.{key}=false (BERT: {key}={want})")
        if int(net.get("token_types") or 0) < 1:
            out.append("model.net.token_types=0 (BERT adds token type 0: token_types=2)")
        transform = net.get("head_transform")
        if transform is None:
            out.append("model.net.head_transform=null (BERT's head: dense, activation, norm)")
        elif act is not None and HEAD_ACTIVATIONS.get(transform) != act:
            out.append(f"model.net.head_transform={transform} (BERT's head uses the feed-forward's activation, "
                       f"{act})")
    else:  # vit: ViTForImageClassification
        if net.get("pool") != "cls":
            out.append(f"model.net.pool={net.get('pool')} (ViTForImageClassification reads the class token: pool=cls)")
        out += _original_transformer("ViT", net, layer, gated)
    return out


def _original_transformer(name: str, net: dict, layer: str | None, gated: bool) -> list[str]:
    """What GPT-2 and ViT share: LayerNorm, an ungated feed-forward, learned positions, multi-head, biases."""
    attn, ffn, out = net.get("attn") or {}, net.get("ffn") or {}, []
    if layer not in LAYER_NORMS:
        out.append(f"norm.layer={layer} ({name}: LayerNorm)")
    if gated:
        out.append(f"ffn gated ({name}: up, activation, down)")
    if _target(net.get("pos")) != LEARNED:
        out.append(f"pos={str(_target(net.get('pos'))).rsplit('.', 1)[-1]} ({name}: learned positions)")
    if attn.get("kv_heads") not in (None, net.get("n_heads")):
        out.append(f"attn.kv_heads={attn['kv_heads']} ({name}: multi-head only)")
    if not net.get("bias", True) or not ffn.get("bias", True):
        out.append(f"no biases ({name} has them: model.net.bias=true, ffn.bias=true)")
    return out


def fitting_layouts(net: dict) -> list[str]:
    return [layout for layout in LAYOUTS if not misfits(net, layout)]


def layouts_for(net: dict) -> list[str]:
    """The layouts of this kind of net (fitting or not)."""
    return [layout for layout in LAYOUTS if NET_OF[layout] == _target(net)]


def _sizes(net: dict, state: dict, layout: str) -> dict:
    d, heads = int(net["d_model"]), int(net["n_heads"])
    kv = int((net.get("attn") or {}).get("kv_heads") or heads)
    up = f"{STACK[layout]}.layers.0.ffn.{'experts.0.' if net.get('moe') else ''}up_proj.weight"
    return {"d": d, "heads": heads, "kv": kv, "head_dim": d // heads, "layers": int(net["n_layers"]),
            "hidden": int(state[up].shape[0]), "experts": int((net.get("moe") or {}).get("num_experts", 0))}


def hf_config(net: dict, state: dict, layout: str, dtype: str, special: dict[str, int | None]) -> dict:
    """``config.json`` of the layout for ``net`` (``state``: its weights without the ``net.`` prefix)."""
    s, norm = _sizes(net, state, layout), net.get("norm") or {}
    eps = float((norm.get("layer") or {}).get("eps", 1e-5))
    kind = {"fp32": "float32", "bf16": "bfloat16"}[dtype]
    if layout == "bert":  # (its vocabulary: the table's rows, attnlab's [MASK] row included)
        return {"architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": int(
                state["embed.weight"].shape[0]), "hidden_size": s["d"], "num_hidden_layers": s["layers"],
                "num_attention_heads": s["heads"], "intermediate_size": s["hidden"],
                "hidden_act": _activation(net["ffn"]), "hidden_dropout_prob": float(net.get("dropout", 0.0)),
                "attention_probs_dropout_prob": float(net.get("attn_dropout", 0.0)),
                "max_position_embeddings": int(net["max_len"]), "type_vocab_size": int(net["token_types"]),
                "layer_norm_eps": eps, "position_embedding_type": "absolute",
                "tie_word_embeddings": bool(net.get("tie_embeddings", True)), "dtype": kind, **special}
    if layout == "vit":  # (layer_norm_eps: transformers' ViT default is 1e-12, attnlab's LayerNorm 1e-5)
        return {"architectures": ["ViTForImageClassification"], "model_type": "vit", "hidden_size": s["d"],
                "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"], "intermediate_size": s["hidden"],
                "hidden_act": _activation(net["ffn"]), "hidden_dropout_prob": float(net.get("dropout", 0.0)),
                "attention_probs_dropout_prob": float(net.get("attn_dropout", 0.0)), "layer_norm_eps": eps,
                "image_size": int(net["image_size"]), "patch_size": int(net["patch_size"]),
                "num_channels": int(net["in_channels"]), "qkv_bias": True, "dtype": kind,
                "id2label": {str(i): str(i) for i in range(int(net["num_classes"]))},
                "label2id": {str(i): i for i in range(int(net["num_classes"]))}}
    common = {"vocab_size": int(net["vocab_size"]), "tie_word_embeddings": bool(net.get("tie_embeddings", True)),
              "dtype": kind, **special}
    if layout == "gpt2":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_positions": int(net["max_len"]),
                "n_embd": s["d"], "n_layer": s["layers"], "n_head": s["heads"], "n_inner": s["hidden"],
                "activation_function": _activation(net["ffn"]), "layer_norm_epsilon": eps,
                "resid_pdrop": float(net.get("dropout", 0.0)), "embd_pdrop": float(net.get("dropout", 0.0)),
                "attn_pdrop": float(net.get("attn_dropout", 0.0)), "scale_attn_weights": True, **common}
    base = float((net.get("pos") or {}).get("base", 10000.0))
    if layout == "mixtral":  # LLaMA's keys, the experts' and its own name (no biases anywhere)
        config = hf_config(net, state, "llama", dtype, special)
        for key in ("mlp_bias", "attention_bias"):
            config.pop(key)
        moe = net["moe"]
        return {**config, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "num_local_experts": int(moe["num_experts"]), "num_experts_per_tok": int(moe.get("top_k", 2)),
                "router_aux_loss_coef": float(moe.get("aux_loss_coef", 0.01)), "router_jitter_noise": 0.0,
                "output_router_logits": False, "sliding_window": None}
    if layout == "qwen3":  # LLaMA's keys (no mlp_bias: Qwen3's MLP has none) and its own name
        config = hf_config(net, state, "llama", dtype, special)
        config.pop("mlp_bias")
        return {**config, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "use_sliding_window": False}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s["d"],
            "intermediate_size": s["hidden"], "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
            "num_key_value_heads": s["kv"], "head_dim": s["head_dim"], "hidden_act": _activation(net["ffn"]),
            "max_position_embeddings": int(net["max_len"]), "rms_norm_eps": eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": base},
            "attention_bias": bool(net.get("bias", True)), "mlp_bias": bool((net.get("ffn") or {}).get("bias")),
            "attention_dropout": float(net.get("attn_dropout", 0.0)), **common}


# The renaming, one table for both directions: (attnlab's tensor or module, the layout's, transposed?). Modules
# carry their .weight and .bias; the q|k|v rows are split apart from the table (QKV).
WHOLE = {"gpt2": [("embed.weight", "transformer.wte.weight"), ("positions.table", "transformer.wpe.weight")],
         **{name: [("embed.weight", "model.embed_tokens.weight")] for name in ("llama", "qwen3", "mixtral")},
         "vit": [("cls_token", "vit.embeddings.cls_token"), ("positions.table", "vit.embeddings.position_embeddings")],
         "bert": [("embed.weight", "bert.embeddings.word_embeddings.weight"),
                  ("positions.table", "bert.embeddings.position_embeddings.weight"),
                  ("type_embed.weight", "bert.embeddings.token_type_embeddings.weight"),
                  ("head.bias", "cls.predictions.bias")]}
AROUND = {"gpt2": [], "llama": [], "qwen3": [], "mixtral": [],  # modules outside the layers
          "vit": [("patch_embed.proj", "vit.embeddings.patch_embeddings.projection", False), ("head", "classifier",
                                                                                                False)],
          "bert": [("embed_norm", "bert.embeddings.LayerNorm", False),
                   ("head_transform.dense", "cls.predictions.transform.dense", False),
                   ("head_transform.norm", "cls.predictions.transform.LayerNorm", False)]}
# (ViT: the names save_pretrained writes, which every transformers version reads; version 5 renames them in memory)
BLOCK = {"gpt2": "transformer.h", "llama": "model.layers", "qwen3": "model.layers", "mixtral": "model.layers",
         "vit": "vit.encoder.layer", "bert": "bert.encoder.layer"}
PER_LAYER = {
    "gpt2": [("sa_norm", "ln_1", False), ("self_attn.qkv_proj", "attn.c_attn", True),  # GPT-2's Conv1D: x @ W
             ("self_attn.out_proj", "attn.c_proj", True), ("ffn_norm", "ln_2", False),
             ("ffn.up_proj", "mlp.c_fc", True), ("ffn.down_proj", "mlp.c_proj", True)],
    "llama": [("sa_norm", "input_layernorm", False), ("self_attn.out_proj", "self_attn.o_proj", False),
              ("ffn_norm", "post_attention_layernorm", False), ("ffn.gate_proj", "mlp.gate_proj", False),
              ("ffn.up_proj", "mlp.up_proj", False), ("ffn.down_proj", "mlp.down_proj", False)],
    "qwen3": [],  # (LLaMA's, and the q/k norms: below)
    "vit": [("sa_norm", "layernorm_before", False), ("self_attn.out_proj", "attention.output.dense", False),
            ("ffn_norm", "layernorm_after", False), ("ffn.up_proj", "intermediate.dense", False),
            ("ffn.down_proj", "output.dense", False)],
    # post-norm: attnlab's sa_norm follows the attention's residual add, as BERT's attention.output.LayerNorm does
    "bert": [("self_attn.out_proj", "attention.output.dense", False), ("sa_norm", "attention.output.LayerNorm", False),
             ("ffn.up_proj", "intermediate.dense", False), ("ffn.down_proj", "output.dense", False),
             ("ffn_norm", "output.LayerNorm", False)],
}
PER_LAYER["qwen3"] = [*PER_LAYER["llama"], ("self_attn.q_norm", "self_attn.q_norm", False),
                      ("self_attn.k_norm", "self_attn.k_norm", False)]
# Mixtral: LLaMA's attention and norms; per expert e, w1 = gate, w3 = up, w2 = down (the names save_pretrained
# writes: transformers 5 fuses the experts in memory only)
PER_LAYER["mixtral"] = [*PER_LAYER["llama"][:3], ("ffn.router", "block_sparse_moe.gate", False)]
EXPERT = [("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")]
FINAL = {"gpt2": "transformer.ln_f", "llama": "model.norm", "qwen3": "model.norm", "mixtral": "model.norm",
         "vit": "vit.layernorm", "bert": None}  # (post-norm: no final norm)
# an untied head's weight (a tied one is the token table, not written)
HEAD = {"gpt2": "lm_head.weight", "llama": "lm_head.weight", "qwen3": "lm_head.weight", "mixtral": "lm_head.weight",
        "bert": "cls.predictions.decoder.weight"}
# BERT's untied head computes with its decoder's own bias; cls.predictions.bias is then read by nothing (it is the
# decoder's only when tied), and is written as the decoder's
UNTIED_BIAS = {"bert": "cls.predictions.decoder.bias"}
QKV = {"llama": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
       "qwen3": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
       "mixtral": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
       "vit": ("attention.attention.query", "attention.attention.key", "attention.attention.value"),
       "bert": ("attention.self.query", "attention.self.key", "attention.self.value")}
# tensors whose shape differs: the layout's is attnlab's with a leading 1 (ViT's (1, T, D) position table)
BATCHED = {"vit.embeddings.position_embeddings"}


def _modules(layout: str, layers: int, experts: int = 0) -> list[tuple[str, str, bool]]:
    """(attnlab module, the layout's module, transposed) for every renamed module: the layers' (a mixture's
    ``experts`` too), the final norm's and those around the layers."""
    stack, block = STACK[layout], BLOCK[layout]
    per_layer = [*PER_LAYER[layout], *((f"ffn.experts.{e}.{ours}", f"block_sparse_moe.experts.{e}.{theirs}", False)
                                       for e in range(experts) for ours, theirs in EXPERT)]
    final = [(f"{stack}.final_norm", FINAL[layout], False)] if FINAL[layout] else []
    return [(f"{stack}.layers.{i}.{ours}", f"{block}.{i}.{theirs}", t) for i in range(layers)
            for ours, theirs, t in per_layer] + [*final, *AROUND[layout]]


def _moved(source: dict, pairs: list[tuple[str, str, bool]]) -> dict:
    """``source``'s tensors under the pairs' second names (transposed where marked), modules with their suffixes."""
    out = {}
    for a, b, transpose in pairs:
        for suffix in ("weight", "bias"):
            t = source.get(f"{a}.{suffix}")
            if t is not None:
                out[f"{b}.{suffix}"] = t.t().contiguous() if transpose and suffix == "weight" else t
    return out


def _qkv_rows(s: dict) -> tuple[int, int, int]:
    return s["d"], s["kv"] * s["head_dim"], s["kv"] * s["head_dim"]


def hf_tensors(net: dict, state: dict, layout: str) -> dict:
    """The weights under the layout's names (``state``: the net's own, without the ``net.`` prefix)."""
    s = _sizes(net, state, layout)
    out = {theirs: state[ours][None] if theirs in BATCHED else state[ours] for ours, theirs in WHOLE[layout]}
    out.update(_moved(state, _modules(layout, s["layers"], s["experts"])))  # (experts: only Mixtral's net has them)
    if layout in QKV:  # q | k | v rows apart (k and v: kv_heads x head_dim rows each)
        for i in range(s["layers"]):
            for suffix in ("weight", "bias"):
                fused = state.get(f"{STACK[layout]}.layers.{i}.self_attn.qkv_proj.{suffix}")
                if fused is not None:
                    for name, part in zip(QKV[layout], fused.split(_qkv_rows(s), dim=0)):
                        out[f"{BLOCK[layout]}.{i}.{name}.{suffix}"] = part
    if layout in HEAD and not net.get("tie_embeddings", True):
        out[HEAD[layout]] = state["head.weight"]
        if layout in UNTIED_BIAS:
            out[UNTIED_BIAS[layout]] = state["head.bias"]
    return out


# --- the other way: a folder transformers wrote -> attnlab's net config and weights -----------------------------
HF_ACTIVATIONS = {"gelu": {"_target_": "torch.nn.GELU", "_partial_": True},
                  "gelu_new": {"_target_": "torch.nn.GELU", "_partial_": True, "approximate": "tanh"},
                  "gelu_pytorch_tanh": {"_target_": "torch.nn.GELU", "_partial_": True, "approximate": "tanh"},
                  "relu": {"_target_": "torch.nn.ReLU", "_partial_": True},
                  "silu": {"_target_": "torch.nn.SiLU", "_partial_": True}}


def _ffn(activation: str, gated: bool, hidden: int, d: int, bias: bool) -> dict:
    """The ffn part whose hidden width is exactly ``hidden`` (attnlab's FeedForward computes it from a multiplier:
    ``multiple_of`` 1 and a multiplier half a unit under, so that the rounding up lands on it)."""
    if activation not in HF_ACTIVATIONS:
        raise ValueError(f"activation {activation!r} (attnlab has {', '.join(HF_ACTIVATIONS)})")
    mult = (hidden - 0.5) / d * (1.5 if gated else 1.0)
    return {"_target_": "attnlab.modules.feedforward.FeedForward", "_partial_": True,
            "activation": dict(HF_ACTIVATIONS[activation]), "gated": gated, "hidden_mult": mult, "multiple_of": 1,
            "bias": bias}


def net_from_hf(config: dict, specials: dict[str, int] | None = None) -> dict:
    """attnlab's net config for a transformers ``config.json`` (its ``model_type``: one of :data:`LAYOUTS`);
    ValueError naming what has no counterpart. ``specials``: the special tokens of the folder's tokenizer (name ->
    id), where the net needs one (a BERT's ``[MASK]``)."""
    kind = config.get("model_type")
    attn = {"_target_": "attnlab.modules.attention.MultiHeadAttention", "_partial_": True, "kv_heads": None,
            "qk_norm": False, "window": None, "scaled": True}
    common = {"_target_": CAUSAL_LM, "vocab_size": int(config["vocab_size"]), "causal": True, "moe": {},
              "tie_embeddings": bool(config.get("tie_word_embeddings", True)), "init": "gpt2"} \
        if kind in ("gpt2", "llama") else {}
    if kind == "gpt2":
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if config.get(flag):
                raise ValueError(f"{flag}=true")
        d = int(config["n_embd"])
        return {**common, "d_model": d, "n_layers": int(config["n_layer"]), "n_heads": int(config["n_head"]),
                "max_len": int(config["n_positions"]), "dropout": float(config.get("resid_pdrop", 0.1)),
                "attn_dropout": float(config.get("attn_pdrop", 0.1)), "bias": True,
                "norm": {"placement": "pre", "layer": {"_target_": "torch.nn.LayerNorm", "_partial_": True,
                                                       "eps": float(config.get("layer_norm_epsilon", 1e-5))}},
                "ffn": _ffn(config.get("activation_function", "gelu_new"), False, int(config.get("n_inner") or 4 * d),
                            d, True),
                "attn": attn, "pos": {"_target_": LEARNED, "_partial_": True}}
    if kind == "mixtral":
        if config.get("sliding_window"):
            raise ValueError(f"sliding_window={config['sliding_window']}")
        net = net_from_hf({**config, "model_type": "llama", "mlp_bias": False, "attention_bias": False})
        net["moe"] = {"_target_": MOE, "_partial_": True, "num_experts": int(config["num_local_experts"]),
                      "top_k": int(config.get("num_experts_per_tok", 2)),
                      "aux_loss_coef": float(config.get("router_aux_loss_coef", 0.01)), "z_loss_coef": 0.0,
                      "balance": "pooled"}  # (Mixtral's loss pools every layer's router logits)
        return net
    if kind == "qwen3":
        if config.get("use_sliding_window"):
            raise ValueError("use_sliding_window=true")
        net = net_from_hf({**config, "model_type": "llama", "mlp_bias": False})
        net["attn"].update(qk_norm=True, qk_norm_eps=net["norm"]["layer"]["eps"])
        return net
    if kind == "llama":
        d, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        if int(config.get("head_dim") or d // heads) != d // heads:
            raise ValueError(f"head_dim={config['head_dim']} is not hidden_size / num_attention_heads")
        rope = config.get("rope_parameters") or {"rope_type": "default", "rope_theta": config.get("rope_theta", 1e4)}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type={rope['rope_type']} (attnlab's rotary embedding is the default one)")
        kv = int(config.get("num_key_value_heads") or heads)
        return {**common, "d_model": d, "n_layers": int(config["num_hidden_layers"]), "n_heads": heads,
                "max_len": int(config["max_position_embeddings"]), "dropout": 0.0,
                "attn_dropout": float(config.get("attention_dropout", 0.0)),
                "bias": bool(config.get("attention_bias", False)),
                "norm": {"placement": "pre", "layer": {"_target_": "attnlab.modules.norm.RMSNorm", "_partial_": True,
                                                       "eps": float(config.get("rms_norm_eps", 1e-6))}},
                "ffn": _ffn(config.get("hidden_act", "silu"), True, int(config["intermediate_size"]), d,
                            bool(config.get("mlp_bias", False))),
                "attn": {**attn, "kv_heads": None if kv == heads else kv},
                "pos": {"_target_": ROTARY, "_partial_": True, "base": float(rope.get("rope_theta", 1e4))}}
    if kind == "vit":
        d = int(config["hidden_size"])
        if not config.get("qkv_bias", True):
            raise ValueError("qkv_bias=false")
        return {"_target_": VIT, "image_size": int(config["image_size"]), "patch_size": int(config["patch_size"]),
                "in_channels": int(config.get("num_channels", 3)), "num_classes": len(config.get("id2label") or
                                                                                       {"0": 0, "1": 1}),
                "d_model": d, "n_layers": int(config["num_hidden_layers"]),
                "n_heads": int(config["num_attention_heads"]), "dropout": float(config.get("hidden_dropout_prob", 0)),
                "attn_dropout": float(config.get("attention_probs_dropout_prob", 0.0)), "bias": True, "pool": "cls",
                "norm": {"placement": "pre", "layer": {"_target_": "torch.nn.LayerNorm", "_partial_": True,
                                                       "eps": float(config.get("layer_norm_eps", 1e-12))}},
                "ffn": _ffn(config.get("hidden_act", "gelu"), False, int(config["intermediate_size"]), d, True),
                "moe": {}, "attn": attn, "pos": {"_target_": LEARNED, "_partial_": True}, "init": "xavier"}
    if kind == "bert":
        return _bert_net(config, specials or {})
    raise ValueError(f"model_type={kind!r} (attnlab reads {', '.join(LAYOUTS)})")


def _bert_net(config: dict, specials: dict[str, int]) -> dict:
    from ..core.special_tokens import MASK_NAMES, mask_id

    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type={config['position_embedding_type']} (attnlab: absolute)")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ValueError("is_decoder=true (attnlab's masked LM is an encoder)")
    mask = mask_id(specials)
    if mask is None:
        raise ValueError(f"its tokenizer.json has no mask token ({' or '.join(MASK_NAMES)})")
    d, act = int(config["hidden_size"]), config.get("hidden_act", "gelu")
    transform = {v: k for k, v in HEAD_ACTIVATIONS.items()}.get(act)
    if transform is None:
        raise ValueError(f"hidden_act={act!r} (attnlab has {', '.join(HEAD_ACTIVATIONS.values())})")
    eps = float(config.get("layer_norm_eps", 1e-12))
    return {"_target_": MASKED_LM, "vocab_size": int(config["vocab_size"]), "mask_id": mask, "d_model": d,
            "n_layers": int(config["num_hidden_layers"]), "n_heads": int(config["num_attention_heads"]),
            "max_len": int(config["max_position_embeddings"]), "dropout": float(config.get("hidden_dropout_prob", 0.1)),
            "attn_dropout": float(config.get("attention_probs_dropout_prob", 0.1)), "bias": True,
            "tie_embeddings": bool(config.get("tie_word_embeddings", True)), "init": "gpt2",
            "norm": {"placement": "post", "layer": {"_target_": "torch.nn.LayerNorm", "_partial_": True, "eps": eps}},
            "ffn": _ffn(act, False, int(config["intermediate_size"]), d, True), "moe": {},
            "attn": {"_target_": "attnlab.modules.attention.MultiHeadAttention", "_partial_": True, "kv_heads": None,
                     "qk_norm": False, "window": None, "scaled": True},
            "pos": {"_target_": LEARNED, "_partial_": True}, "embed_norm": True,
            "token_types": int(config.get("type_vocab_size", 2)), "head_transform": transform, "head_bias": True}


def tensors_from_hf(net: dict, theirs: dict, layout: str) -> dict:
    """attnlab's net weights (names without the ``net.`` prefix) from the layout's: :func:`hf_tensors` read
    backwards (the same tables), so that exporting them again gives the same tensors. A tied model's head is its
    embedding."""
    import torch

    layers = int(net["n_layers"])
    out = {ours: theirs[name][0] if name in BATCHED else theirs[name] for ours, name in WHOLE[layout]}
    experts = int((net.get("moe") or {}).get("num_experts", 0))  # (only Mixtral's net has them)
    out.update(_moved(theirs, [(b, a, t) for a, b, t in _modules(layout, layers, experts)]))
    if layout in QKV:
        for i in range(layers):
            for suffix in ("weight", "bias"):
                parts = [theirs.get(f"{BLOCK[layout]}.{i}.{name}.{suffix}") for name in QKV[layout]]
                if parts[0] is not None:
                    out[f"{STACK[layout]}.layers.{i}.self_attn.qkv_proj.{suffix}"] = torch.cat(parts, dim=0)
    if layout in HEAD:
        out["head.weight"] = out["embed.weight"] if net.get("tie_embeddings", True) else theirs[HEAD[layout]]
        if layout in UNTIED_BIAS and not net.get("tie_embeddings", True):
            out["head.bias"] = theirs[UNTIED_BIAS[layout]]
    return out
