"""A prompt with images -> token ids and the ImageInputs the engine needs (the engine frontend
calls this for an ImagePrompt; the server, off its event loop, before it counts the tokens): each image decoded
within the bounds (vision/decode.py), preprocessed as the model's image processor does, its
marker expanded to the model's image sequence (the placeholders the embeddings replace), and its
file's SHA-256 for the prefix cache. An Idefics3 image is several tiles (vision/tiles.py), each
its own ImageInput (its own run of placeholders, keyed by the file's digest and its index)."""
from __future__ import annotations

import hashlib

from mlxr.errors import InvalidParameterError
from mlxr.model_config import VisionArgs
from mlxr.types import ImageInput, ImagePrompt, ImagePromptIds
from mlxr.vision.decode import decode_image
from mlxr.vision.limits import image_limits
from mlxr.vision.preprocess import pixel_values
from mlxr.vision.tiles import Tiles, tile_sequence, tiled_pixel_values


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
    decoded = [decode_image(data, limits, name) for name, data in zip(names, prompt.images)]
    if vision.tiled:
        tiles = [tiled_pixel_values(im, vision.preprocess, limits.max_tiles, name) for name, im in zip(names, decoded)]
    else:
        tiles = [Tiles([pixel_values(im, vision.preprocess)], 0, 0) for im in decoded]
    ids = tokenizer.encode(_expanded(prompt, vision, tiles), add_special_tokens=prompt.add_special_tokens)
    spans = _placeholder_runs(ids, vision.image_token_id)
    counts = [image_tokens(vision, p) for t in tiles for p in t.pixels]
    if len(spans) != len(counts) or any(n != want for (_, n), want in zip(spans, counts)):
        raise InvalidParameterError("prompt", f"the prompt's text holds image tokens ({vision.image_token!r}) of its own")
    runs = iter(spans)
    images = [ImageInput(_digest(data, j, len(t.pixels)), *next(runs), p.tobytes(), list(p.shape))
              for data, t in zip(prompt.images, tiles) for j, p in enumerate(t.pixels)]
    return ImagePromptIds(ids, images)


def _digest(data: bytes, tile: int, tiles: int) -> bytes:
    """The prefix-cache key of one image's (or one of its tiles') blocks."""
    file = hashlib.sha256(data).digest()
    return file if tiles == 1 else hashlib.sha256(file + tile.to_bytes(4, "little")).digest()


def _expanded(prompt: ImagePrompt, vision: VisionArgs, tiles: list[Tiles]) -> str:
    marker, n = vision.image_marker, len(prompt.images)
    text = prompt.text
    found = text.count(marker)
    if found == 0:
        text = marker * n + text
    elif found != n:
        raise InvalidParameterError("prompt", f"the prompt marks {found} images ({marker!r}) for the {n} sent")
    pieces = text.split(marker)
    out = [pieces[0]]
    for t, piece in zip(tiles, pieces[1:]):
        placeholders = vision.image_token * image_tokens(vision, t.pixels[0])
        image = tile_sequence(t, placeholders) if vision.tiled else vision.image_sequence.format(image=placeholders)
        out += [image, piece]
    return "".join(out)


def image_tokens(vision: VisionArgs, pixels) -> int:
    """An image's (or tile's) placeholders: the tower's fixed count, or (tokens_per_image 0,
    Qwen2.5-VL) one per merged block of patches of its resized pixels [3, H, W]."""
    if vision.tokens_per_image:
        return vision.tokens_per_image
    side = vision.patch_size * vision.scale_factor
    return (pixels.shape[1] // side) * (pixels.shape[2] // side)


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
