"""The clip.* header every tiny mmproj GGUF of the tests shares (tests only): the keys llama.cpp's converter
(conversion MmprojModel) writes for a vision tower, in its order, so the files stay byte-identical to the
ones the committed goldens were made from."""

from __future__ import annotations

import gguf

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)   # OpenAI CLIP's (Qwen-VL's and Pixtral's preprocessor_config)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def mmproj_header(w: gguf.GGUFWriter, name: str, projector: str, *, text_hidden: int, hidden: int, ffn: int,
                  layers: int, heads: int, image_size: int, patch_size: int,
                  mean: tuple[float, ...] = CLIP_MEAN, std: tuple[float, ...] = CLIP_STD, eps: float = 1e-6) -> None:
    """Write an mmproj's general and clip.vision keys: `projector` the clip.projector_type, `text_hidden` the
    projection's output width (the text model's hidden size)."""
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(projector)
    w.add_vision_projection_dim(text_hidden)
    w.add_vision_image_size(image_size)
    w.add_vision_patch_size(patch_size)
    w.add_vision_embedding_length(hidden)
    w.add_vision_feed_forward_length(ffn)
    w.add_vision_block_count(layers)
    w.add_vision_head_count(heads)
    w.add_vision_image_mean(list(mean))
    w.add_vision_image_std(list(std))
    w.add_vision_attention_layernorm_eps(eps)
