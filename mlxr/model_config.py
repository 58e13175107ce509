"""A model's shape as the engine and its math see it, read from a checkpoint's config (HF
config.json or GGUF metadata) and frozen: the language model (ModelArgs), its rope scaling,
recurrent-state layers, and a vision tower with its image preprocessing. Stdlib only."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RopeScaling:
    """HF `rope_scaling`: the "llama3", "linear", "longrope" and "yarn" kinds change the frequencies."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # longrope (Phi-3): per-frequency divisors, long ones once a step reaches past
    # original_max_position_embeddings; cos and sin are scaled by attention_factor.
    long_factor: tuple[float, ...] = ()
    short_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0
    # yarn (gpt-oss): the ramp between the dimensions turning beta_fast and beta_slow times over
    # the original context, its ends rounded outwards where truncate (layers/yarn.py).
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True


@dataclass(frozen=True)
class ImageTiling:
    """Idefics3's image splitting (preprocessor_config.json of Idefics3 / SmolVLM): the longest
    edge resized to `longest_edge`, then (split) cut into tiles of `tile` pixels a side plus the
    whole image at that size, or (not split) the whole image alone at that size."""

    longest_edge: int
    tile: int
    split: bool = True


@dataclass(frozen=True)
class ImagePreprocess:
    """A transformers image processor's numbers (preprocessor_config.json): resize to a fixed
    size, or the shortest edge then a centre crop (CLIP), rescale, normalise."""

    height: int = 224
    width: int = 224
    shortest_edge: int | None = None  # set: resize keeping the aspect, then crop to height x width
    resample: int = 2  # a PIL resampling filter (2 bilinear, 3 bicubic)
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    do_rescale: bool = True
    do_normalize: bool = True
    tiling: ImageTiling | None = None  # set: Idefics3's tiles (vision/tiles.py) in place of the resize above
    # > 0: Qwen2-VL's smart_resize in place of the above: each side a multiple of resize_factor,
    # the area within min_pixels..max_pixels, the aspect kept (vision/preprocess.py)
    resize_factor: int = 0
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280


@dataclass(frozen=True)
class VisionArgs:
    """A vision tower, its projector and the prompt's image tokens (a multimodal config.json)."""

    tower: str  # "siglip" | "clip" | "idefics3" (SigLIP with its bucketed positions) | "qwen2_5_vl"
    projector: str  # "gemma3" (avg-pool, soft-embedding norm, one matrix) | "llava" (two-layer MLP) | "idefics3"
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    layer_norm_eps: float
    hidden_act: str  # "gelu_pytorch_tanh" | "quick_gelu" | "gelu"
    tokens_per_image: int
    image_token_id: int  # the placeholder the embeddings replace
    image_marker: str  # the text a chat template writes for an image ("<start_of_image>")
    image_sequence: str  # what the marker expands to; "{image}" stands for the placeholders
    image_token: str  # the placeholder's text
    bidirectional: bool = False  # an image's tokens attend to each other both ways (Gemma 3)
    preprocess: ImagePreprocess = field(default_factory=ImagePreprocess)
    num_channels: int = 3
    feature_layer: int = -1  # CLIP (LLaVA): the encoder layer whose output is the image's features
    tiled: bool = False  # Idefics3: an image is tiles (preprocess.tiling), each its own run of placeholders
    scale_factor: int = 1  # Idefics3: the connector's pixel shuffle, scale_factor x scale_factor patches a token
    # Qwen2.5-VL: patches span temporal_patch_size frames; window attention (window_size pixels)
    # except in full_attention_layers; the merger joins scale_factor x scale_factor patches.
    temporal_patch_size: int = 1
    window_size: int = 0
    full_attention_layers: tuple[int, ...] = ()
    rope_theta: float = 10000.0
    mrope_section: tuple[int, ...] = ()  # the language model's M-RoPE: rotary pairs per (t, h, w) section


@dataclass(frozen=True)
class LinearAttentionArgs:
    """Gated DeltaNet layers (Qwen3.5's "linear_attention" layers): their heads, and which
    layers they are (the others are full attention)."""

    layers: tuple[bool, ...]  # per layer: True where it is a linear-attention layer
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    def state_bytes_per_sequence(self) -> int:
        """fp32 conv state plus delta-rule state of every linear layer, for one sequence."""
        conv_dim = 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
        per_layer = conv_dim * (self.conv_kernel - 1) + self.num_value_heads * self.key_head_dim * self.value_head_dim
        return 4 * per_layer * sum(self.layers)


@dataclass(frozen=True)
class ModelArgs:
    """The architecture of one model, in Hugging Face terms (config.json names)."""

    model_type: str  # canonical: a key of mlxr.models.ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (qwen2)
    hidden_act: str = "silu"  # "silu" | "gelu_pytorch_tanh"
    # Gemma 3 and Mistral: window of the sliding layers (None = every layer is global).
    sliding_window: int | None = None
    # Per layer: True where the layer uses the sliding window.
    sliding_layers: tuple[bool, ...] = ()
    rope_local_base_freq: float | None = None  # gemma3: theta of the sliding layers
    query_pre_attn_scalar: float | None = None  # gemma3: attention scale = this ** -0.5
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    # granite: embeddings times embedding_multiplier, each block's attention and MLP outputs times
    # residual_multiplier, attention scale attention_multiplier, logits divided by logits_scaling
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None  # None: head_dim ** -0.5
    logits_scaling: float = 1.0
    # mixture of experts (mixtral, qwen3moe): 0 experts = a dense MLP
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int | None = None  # None: intermediate_size
    norm_topk_prob: bool = True  # the top-k router weights are renormalised to sum to 1
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    vision: VisionArgs | None = None  # a vision-language model's tower; None: text only
    linear_attention: LinearAttentionArgs | None = None  # recurrent-state layers (Qwen3.5); None: all attention
    partial_rotary_factor: float = 1.0  # the share of each head's dims that RoPE rotates (the first ones)
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def is_sliding(self, layer: int) -> bool:
        return bool(self.sliding_layers) and self.sliding_layers[layer]
