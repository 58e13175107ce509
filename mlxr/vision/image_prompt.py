"""A prompt with images -> token ids and the ImageInputs the engine needs (the engine frontend
calls this for an ImagePrompt; the server, off its event loop, before it counts the tokens): each image decoded
within the bounds (vision/decode.py), preprocessed as the model's image processor does, its
marker expanded to the model's image sequence (the placeholders the embeddings replace), and its
file's SHA-256 for the prefix cache."""
from __future__ import annotations

import hashlib

from mlxr.config import VisionArgs
from mlxr.errors import InvalidParameterError
from mlxr.types import ImageInput, ImagePrompt, ImagePromptIds
from mlxr.vision.decode import decode_image
from mlxr.vision.limits import image_limits
from mlxr.vision.preprocess import pixel_values


def check_takes_images(vision: VisionArgs | None, n_images: int) -> VisionArgs:
    if vision is None:
        raise InvalidParameterError("images", "this model takes text only; send no images")
    limit = image_limits().max_images
    if n_images > limit:
        raise InvalidParameterError("images", f"{n_images} images, above the limit of {limit} a request "
                                              "(MLXR_MAX_IMAGES)")
    return vision


def image_prompt_ids(prompt: ImagePrompt, vision: VisionArgs | None, tokenizer) -> ImagePromptIds:
    vision = check_takes_images(vision, len(prompt.images))
    limits = image_limits()
    names = prompt.names or tuple(f"images[{i}]" for i in range(len(prompt.images)))
    pixels = [pixel_values(decode_image(data, limits, name), vision.preprocess)
              for name, data in zip(names, prompt.images)]
    ids = tokenizer.encode(_expanded(prompt, vision), add_special_tokens=prompt.add_special_tokens)
    spans = _placeholder_runs(ids, vision.image_token_id)
    if len(spans) != len(prompt.images) or any(n != vision.tokens_per_image for _, n in spans):
        raise InvalidParameterError("prompt", f"the prompt's text holds image tokens ({vision.image_token!r}) of its own")
    images = [ImageInput(hashlib.sha256(data).digest(), offset, n, p.tobytes(), list(p.shape))
              for data, (offset, n), p in zip(prompt.images, spans, pixels)]
    return ImagePromptIds(ids, images)


def _expanded(prompt: ImagePrompt, vision: VisionArgs) -> str:
    marker, n = vision.image_marker, len(prompt.images)
    text = prompt.text
    found = text.count(marker)
    if found == 0:
        text = marker * n + text
    elif found != n:
        raise InvalidParameterError("prompt", f"the prompt marks {found} images ({marker!r}) for the {n} sent")
    sequence = vision.image_sequence.format(image=vision.image_token * vision.tokens_per_image)
    return sequence.join(text.split(marker))


def _placeholder_runs(ids: list[int], image_id: int) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != image_id:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs
