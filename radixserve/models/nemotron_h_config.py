"""NVIDIA Nemotron-H shapes (``NemotronHForCausalLM``, model_type ``nemotron_h``: Nemotron-H
8B / 47B, Nemotron Nano 9B / 12B v2, and the MoE Nemotron 3 Nano 30B-A3B; llama.cpp's
``nemotron_h`` and ``nemotron_h_moe``) from a Hugging Face config.json or GGUF metadata, and a
folder's tensor names as the model class (models/nemotron_h.py) names them.

Each layer is one pre-norm block around one mixer, named by a character of the config's
``hybrid_override_pattern`` (or by ``layers_block_type``, the names transformers writes):

- ``M`` (``linear_attention``): a Mamba2 mixer (layers/mamba2.py) → ``LINEAR``;
- ``*`` (``full_attention``): GQA attention without any position encoding → ``FULL``;
- ``-`` (``mlp``): a squared-ReLU MLP ``down(relu(up(x)) ** 2)`` → ``MLP_ONLY``;
- ``E`` (``moe``): a sparse MoE block of squared-ReLU experts and a shared one, routed as
  DeepSeek-V3 routes (sigmoid scores, ``e_score_correction_bias`` for the choice only, grouped
  top-k, ``routed_scaling_factor``) → ``MLP_ONLY``, sparse in ``ModelConfig.moe``.

A GGUF file has no pattern: a layer's type is read from its tensors (``ssm_in``: Mamba2,
``attn_q``: attention, ``ffn_gate_inp``: MoE, ``ffn_up``: MLP), which is also what its per-layer
``head_count_kv`` and ``feed_forward_length`` arrays say in a well-converted file.

NOTE: the one field that differs between a folder and its GGUF file is
``max_position_embeddings``: without rope the converter writes an arbitrary 2**20 as
``context_length`` (the engine's context is capped by the KV pool either way).
"""

from __future__ import annotations

from radixserve.model_config import FULL, LINEAR, MLP_ONLY, ModelConfig, MoeConfig
from radixserve.recurrent_params import Mamba2Params

NEMOTRON_H_ARCHITECTURE = "NemotronHForCausalLM"
NEMOTRON_H_ARCHITECTURES = (NEMOTRON_H_ARCHITECTURE,)
MAMBA, ATTENTION, MLP, MOE = "M", "*", "-", "E"  # the pattern's characters
_BLOCK_NAMES = {"linear_attention": MAMBA, "mamba": MAMBA, "full_attention": ATTENTION,
                "attention": ATTENTION, "mlp": MLP, "moe": MOE}
_ENGINE_TYPES = {MAMBA: LINEAR, ATTENTION: FULL, MLP: MLP_ONLY, MOE: MLP_ONLY}
_DEFAULTS = {  # transformers' NemotronHConfig defaults, for the fields a file omits
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096,
    "intermediate_size": 21504, "ssm_state_size": 128, "mamba_num_heads": 128,
    "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4, "time_step_limit": (0.0, float("inf")),
    "use_conv_bias": True, "use_bias": False, "mlp_bias": False, "layer_norm_epsilon": 1e-5,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 7688,
    "moe_shared_expert_intermediate_size": 7688, "routed_scaling_factor": 1.0, "n_group": 1,
    "topk_group": 1, "norm_topk_prob": True}
# the older spellings transformers still reads (NemotronHConfig.__post_init__)
_LEGACY_KEYS = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel",
                "mamba_dt_limit": "time_step_limit", "mamba_conv_bias": "use_conv_bias"}
_REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads")
_ROUTER_BIAS = "gate.e_score_correction_bias"
# transformers' router adds this to the sum of the chosen sigmoid scores before dividing
ROUTER_NORM_EPS = 1e-20


def nemotron_h_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of a ``NemotronHForCausalLM`` config.json. ValueError for what
    radixserve does not run: activations other than squared ReLU (MLPs) and SiLU (Mamba2),
    MLP biases, the latent MoE projections (``moe_latent_size``: Nemotron 3 Super), an
    unknown block type."""
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise ValueError(f"Nemotron-H config.json lacks {missing}")
    cfg = {**cfg, **{new: cfg[old] for old, new in _LEGACY_KEYS.items() if old in cfg}}

    def get(key):
        value = cfg.get(key)
        return _DEFAULTS.get(key) if value is None else value

    _check_supported(cfg)
    pattern = hf_pattern(cfg)
    heads = cfg["num_attention_heads"]
    moe = _hf_moe(get, pattern) if MOE in pattern else None
    return ModelConfig(
        architecture=NEMOTRON_H_ARCHITECTURE,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=len(pattern),
        num_heads=heads,
        num_kv_heads=get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg.get("attention_head_dim") or _DEFAULTS["head_dim"],
        intermediate_size=_mlp_width(pattern, lambda: get("intermediate_size"), moe),
        rms_norm_eps=get("layer_norm_epsilon"),
        max_position_embeddings=get("max_position_embeddings"),
        # transformers never ties the head (``_tied_weights_keys = {}``), whatever
        # tie_word_embeddings says: the folder holds lm_head.weight
        tie_word_embeddings=False,
        linear_attn=Mamba2Params(
            layer_types=engine_layer_types(pattern),
            num_heads=get("mamba_num_heads"),
            head_dim=get("mamba_head_dim"),
            state_size=get("ssm_state_size"),
            n_groups=get("n_groups"),
            conv_kernel=get("conv_kernel"),
            time_step_limit=_time_step_limit(get("time_step_limit")),
            conv_bias=bool(get("use_conv_bias")),
            proj_bias=bool(get("use_bias")),
        ),
        moe=moe,
    )


def _check_supported(cfg: dict) -> None:
    checks = (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu"))
    for key, supported in checks:
        if cfg.get(key, supported) != supported:
            raise ValueError(f"unsupported Nemotron-H {key} {cfg[key]!r}; supported: "
                             f"[{supported!r}]")
    if cfg.get("mlp_bias"):
        raise ValueError("Nemotron-H with MLP biases (mlp_bias) is not supported; no released "
                         "checkpoint has them")
    if cfg.get("moe_latent_size") is not None:
        raise ValueError("Nemotron-H MoE latent projections (moe_latent_size: Nemotron 3 "
                         "Super) are not supported; supported: Nemotron-H, Nemotron Nano v2, "
                         "Nemotron 3 Nano")


def hf_pattern(cfg: dict) -> str:
    """The block pattern ("M-M*-...") of a config.json: ``layers_block_type`` where present
    (as transformers prefers it), else ``hybrid_override_pattern``. ValueError for an unknown
    block or a missing pattern."""
    names = cfg.get("layers_block_type")
    if names is not None:
        unknown = sorted({n for n in names if n not in _BLOCK_NAMES})
        if unknown:
            raise ValueError(f"unknown Nemotron-H block types {unknown}; supported: "
                             f"{sorted(_BLOCK_NAMES)}")
        return "".join(_BLOCK_NAMES[n] for n in names)
    pattern = cfg.get("hybrid_override_pattern")
    if not pattern:
        raise ValueError("a Nemotron-H config.json needs hybrid_override_pattern or "
                         "layers_block_type")
    unknown = sorted(set(pattern) - set(_ENGINE_TYPES))
    if unknown:
        raise ValueError(f"unknown characters {unknown} in hybrid_override_pattern; "
                         f"supported: {sorted(_ENGINE_TYPES)}")
    return pattern


def engine_layer_types(pattern: str) -> tuple[str, ...]:
    return tuple(_ENGINE_TYPES[c] for c in pattern)


def _mlp_width(pattern: str, dense_width, moe: MoeConfig | None) -> int:
    """``intermediate_size``: the MLP blocks' width (``dense_width()``), else the experts'
    (a pattern without ``-``: Nemotron 3 Nano), else 0 (no MLP at all)."""
    if MLP in pattern:
        return dense_width()
    return moe.intermediate_size if moe is not None else 0


def _time_step_limit(value) -> tuple[float, float]:
    """transformers writes infinity as ``{"__float__": "Infinity"}``, the releases as JSON's
    ``Infinity``."""
    return tuple(float(v["__float__"]) if isinstance(v, dict) else float(v) for v in value)


def _hf_moe(get, pattern: str) -> MoeConfig:
    """transformers' ``NemotronHMoE``: sigmoid router with its correction bias, grouped top-k,
    top-k weights renormalized (``norm_topk_prob``) then scaled, squared-ReLU experts and one
    ungated shared expert; sparse in the ``E`` layers only."""
    return MoeConfig(
        get("n_routed_experts"), get("num_experts_per_tok"), get("moe_intermediate_size"),
        norm_topk_prob=bool(get("norm_topk_prob")),
        dense_layers=tuple(i for i, c in enumerate(pattern) if c != MOE),
        shared_expert_size=get("moe_shared_expert_intermediate_size"),
        scoring="sigmoid", expert_bias=True, num_groups=get("n_group"),
        topk_groups=get("topk_group"), routed_scaling=float(get("routed_scaling_factor")),
        norm_eps=ROUTER_NORM_EPS, expert_activation="relu2", shared_expert_gate=False)


# -- GGUF -------------------------------------------------------------------------------------

def gguf_pattern(tensor_names: set[str], num_layers: int) -> str:
    """Each layer's block from the tensors it has (see the module docstring)."""
    kinds = (("ssm_in", MAMBA), ("attn_q", ATTENTION), ("ffn_gate_inp", MOE), ("ffn_up", MLP))
    pattern = []
    for i in range(num_layers):
        kind = next((c for base, c in kinds if f"blk.{i}.{base}.weight" in tensor_names), None)
        if kind is None:
            raise ValueError(f"GGUF layer {i} has none of the tensors of a Nemotron-H block "
                             "(ssm_in, attn_q, ffn_gate_inp, ffn_up)")
        pattern.append(kind)
    return "".join(pattern)


def nemotron_h_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of a ``nemotron_h`` / ``nemotron_h_moe`` GGUF file (the keys llama.cpp's
    converter writes); ``field(reader, key, default)`` reads one metadata value. An MTP block
    (``nextn_predict_layers`` blocks after the decoder's) is not part of it."""
    def get(key, default=None):
        return field(reader, f"{gguf_arch}.{key}", default)

    tensors = {t.name: t for t in reader.tensors}
    names = set(tensors)
    num_layers = get("block_count") - get("nextn_predict_layers", 0)
    pattern = gguf_pattern(names, num_layers)
    if get("moe_latent_size") or any(".ffn_latent_" in n for n in names):
        raise ValueError("Nemotron-H MoE latent projections (Nemotron 3 Super) are not "
                         "supported")
    hidden, heads = get("embedding_length"), get("attention.head_count")
    mamba_layer = pattern.index(MAMBA) if MAMBA in pattern else 0
    num_mamba_heads = get("ssm.time_step_rank")
    moe = _gguf_moe(get, pattern, names) if MOE in pattern else None
    return ModelConfig(
        architecture=arch,
        vocab_size=get("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=_per_layer_max(get("attention.head_count_kv", heads)),
        head_dim=get("attention.key_length", hidden // heads),
        intermediate_size=_mlp_width(
            pattern, lambda: _rows(tensors[f"blk.{pattern.index(MLP)}.ffn_up.weight"]), moe),
        rms_norm_eps=get("attention.layer_norm_epsilon",
                         get("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=get("context_length", 4096),
        tie_word_embeddings="output.weight" not in names,
        linear_attn=Mamba2Params(
            layer_types=engine_layer_types(pattern),
            num_heads=num_mamba_heads,
            head_dim=get("ssm.inner_size") // num_mamba_heads,
            state_size=get("ssm.state_size"),
            n_groups=get("ssm.group_count"),
            conv_kernel=get("ssm.conv_kernel"),
            conv_bias=f"blk.{mamba_layer}.ssm_conv1d.bias" in names,
            proj_bias=f"blk.{mamba_layer}.ssm_in.bias" in names,
        ),
        moe=moe,
    )


def _gguf_moe(get, pattern: str, names: set[str]) -> MoeConfig:
    first = pattern.index(MOE)
    return MoeConfig(
        get("expert_count"), get("expert_used_count"), get("expert_feed_forward_length"),
        norm_topk_prob=bool(get("expert_weights_norm", False)),
        dense_layers=tuple(i for i, c in enumerate(pattern) if c != MOE),
        shared_expert_size=(get("expert_shared_feed_forward_length")
                            if f"blk.{first}.ffn_up_shexp.weight" in names else 0),
        scoring="sigmoid", expert_bias=f"blk.{first}.exp_probs_b.bias" in names,
        num_groups=get("expert_group_count", 1), topk_groups=get("expert_group_used_count", 1),
        routed_scaling=float(get("expert_weights_scale", 1.0)), norm_eps=ROUTER_NORM_EPS,
        expert_activation="relu2", shared_expert_gate=False)


def _per_layer_max(value) -> int:
    """A per-layer array's value for the layers that have one (attention's KV heads)."""
    return max(value) if isinstance(value, (list, tuple)) else value


def _rows(tensor) -> int:
    return int(tensor.shape[1])  # GGUF lists a matrix's shape (cols, rows)


def nemotron_h_hf_name(name: str) -> str | None:
    """A folder's tensor name → the model's (models/nemotron_h.py): ``backbone.`` (the
    releases) or ``model.`` (transformers' in-memory names) removed, ``embeddings`` →
    ``embed_tokens``, ``norm_f`` → ``norm``, the MoE block's router bias and shared expert under
    layers/moe.py's names; None for the MTP block (``mtp.*``), which does not run here."""
    if name.startswith("mtp."):
        return None
    name = name.removeprefix("backbone.").removeprefix("model.")
    if name.startswith("embeddings."):
        return "embed_tokens." + name.removeprefix("embeddings.")
    if name.startswith("norm_f."):
        return "norm." + name.removeprefix("norm_f.")
    return moe_block_name(name)


def moe_block_name(name: str) -> str:
    """transformers' ``NemotronHMoE`` names → layers/moe.py's ``SparseMoeBlock`` ones."""
    if name.endswith(_ROUTER_BIAS):
        return name.removesuffix(_ROUTER_BIAS) + "expert_bias"
    return name.replace(".mixer.shared_experts.", ".mixer.shared_expert.")
