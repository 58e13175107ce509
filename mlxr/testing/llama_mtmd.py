"""llama.cpp's own multimodal path, `llama-mtmd-cli` (libmtmd), run on a GGUF + mmproj pair, and
the same prompt built as its ids for MLXR: Gemma 3's turn format with the image where libmtmd
puts it (`<start_of_image>`, the image's tokens, `<end_of_image>`, without the two newlines
around them that transformers' processor writes). Its figures come from its own log lines."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

MEDIA_MARKER = "<__media__>"  # libmtmd's default marker, where its formatted prompt holds the image
BIN_DIR = Path(os.environ.get("MLXR_LLAMA_BIN", "/work/lcpp/llama.cpp/build-cpu/bin"))
TURN = ("<start_of_turn>user\n", "{question}<end_of_turn>\n<start_of_turn>model\n")


@dataclass(frozen=True)
class MtmdRun:
    generated: bytes  # the reply as llama-mtmd-cli printed it (stdout)
    image_tokens: int
    prompt_tokens: int
    encode_ms: float  # "mtmd batch encoding done in N ms": the tower and projector
    prompt_ms: float  # llama_perf's prompt eval time: text and image, up to the first token
    formatted: str  # the chat prompt it rendered
    image_batches: tuple[int, ...] = ()  # the tokens of each image (or tile) it encoded, in order


def mtmd_cli(bin_dir: Path = BIN_DIR) -> Path | None:
    exe = Path(bin_dir) / "llama-mtmd-cli"
    return exe if exe.is_file() and os.access(exe, os.X_OK) else None


_PERF = "prompt eval time ="  # the last line read below
_ATTEMPTS = 8  # it loses them in 1 to 3 runs of 10 on a loaded host


def run_mtmd(exe: Path, model: Path, mmproj: Path, image: Path, question: str, n_predict: int,
             threads: int = 2, extra: tuple[str, ...] = ()) -> MtmdRun:
    cmd = [str(exe), "-m", str(model), "--mmproj", str(mmproj), "--image", str(image), "-p", question,
           "--temp", "0", "-n", str(n_predict), "--ignore-eos", "-t", str(threads), "-v", "--seed", "1", *extra]
    for _ in range(_ATTEMPTS):
        res = subprocess.run(cmd, capture_output=True, timeout=600)
        log = res.stderr.decode(errors="replace")
        if res.returncode != 0:
            raise RuntimeError(f"llama-mtmd-cli failed ({res.returncode}):\n{log[-3000:]}")
        if _PERF in log:  # its log is written by a thread that can lose the last lines at exit: run it again
            break
    return MtmdRun(res.stdout.strip(b"\n"), int(_find(r"encoding batch with \d+ entries and total (\d+) tokens", log)),
                   int(_find(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens", log)),
                   float(_find(r"mtmd batch encoding done in ([\d.]+) ms", log)),
                   float(_find(r"prompt eval time =\s*([\d.]+) ms", log)),
                   _find(r"formatted_chat\.prompt: (.*?)\n\S*\s*[DI] mtmd_", log, re.S),
                   tuple(int(n) for n in re.findall(r"encoding batch with \d+ entries and total (\d+) tokens", log)))


def _find(pattern: str, log: str, flags: int = 0) -> str:
    m = re.search(pattern, log, flags)
    if m is None:
        raise RuntimeError(f"llama-mtmd-cli's log has no line matching {pattern!r}:\n{log[-3000:]}")
    return m.group(1)


def gemma3_mtmd_ids(tokenizer, vision, question: str, image: bytes):
    """The ids libmtmd builds for one image then `question` in a Gemma 3 user turn, with the
    image made ready for MLXR's engine (ImagePromptIds)."""
    import hashlib

    from mlxr.types import ImageInput, ImagePromptIds
    from mlxr.vision.decode import decode_image
    from mlxr.vision.limits import image_limits
    from mlxr.vision.preprocess import pixel_values

    head = tokenizer.encode(TURN[0], add_special_tokens=True)
    boi, eoi = (tokenizer.encode(t, add_special_tokens=False) for t in ("<start_of_image>", "<end_of_image>"))
    tail = tokenizer.encode(TURN[1].format(question=question), add_special_tokens=False)
    offset = len(head) + len(boi)
    ids = head + boi + [vision.image_token_id] * vision.tokens_per_image + eoi + tail
    pixels = pixel_values(decode_image(image, image_limits(), "image"), vision.preprocess)
    return ImagePromptIds(ids, [ImageInput(hashlib.sha256(image).digest(), offset, vision.tokens_per_image,
                                           pixels.tobytes(), list(pixels.shape))])


def printed_bytes(gguf_metadata: dict, ids: list[int]) -> bytes:
    """What llama-mtmd-cli prints for `ids` of a GPT-2-style byte-level vocabulary: a normal
    token's bytes, a control token's text (it prints special tokens)."""
    tokens, types = gguf_metadata["tokenizer.ggml.tokens"], gguf_metadata["tokenizer.ggml.token_type"]
    to_byte = {ch: b for b, ch in _byte_chars().items()}
    out = bytearray()
    for i in ids:
        out += tokens[i].encode() if types[i] == 3 else bytes(to_byte[ch] for ch in tokens[i])
    return bytes(out)


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest for 256 + n."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {b: chr(b) for b in kept}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def llava_mtmd_ids(tokenizer, vision, formatted: str, image: bytes):
    """The ids libmtmd builds of its formatted prompt (`formatted`, holding one `<__media__>`) for
    LLaVA: the text around the marker tokenized as it does it (the start of the sequence with the
    vocabulary's BOS), one image token per patch in its place (no markers around it)."""
    import hashlib

    from mlxr.types import ImageInput, ImagePromptIds
    from mlxr.vision.decode import decode_image
    from mlxr.vision.limits import image_limits
    from mlxr.vision.preprocess import pixel_values

    before, after = formatted.split(MEDIA_MARKER)
    head = tokenizer.encode(before, add_special_tokens=True)
    tail = tokenizer.encode(after, add_special_tokens=False)
    ids = head + [vision.image_token_id] * vision.tokens_per_image + tail
    pixels = pixel_values(decode_image(image, image_limits(), "image"), vision.preprocess)
    return ImagePromptIds(ids, [ImageInput(hashlib.sha256(image).digest(), len(head), vision.tokens_per_image,
                                           pixels.tobytes(), list(pixels.shape))])


def qwen25_vl_mtmd_ids(tokenizer, vision, formatted: str, image: bytes):
    """The ids libmtmd builds of its formatted prompt for Qwen2.5-VL: the text around the marker,
    `<|vision_start|>`, one `<|image_pad|>` per token of the smart-resized image, `<|vision_end|>`."""
    import hashlib

    from mlxr.types import ImageInput, ImagePromptIds
    from mlxr.vision.decode import decode_image
    from mlxr.vision.limits import image_limits
    from mlxr.vision.preprocess import pixel_values

    before, after = formatted.split(MEDIA_MARKER)
    start, end = (tokenizer.encode(t, add_special_tokens=False) for t in ("<|vision_start|>", "<|vision_end|>"))
    head = tokenizer.encode(before, add_special_tokens=True) + start
    pixels = pixel_values(decode_image(image, image_limits(), "image"), vision.preprocess)
    count = pixels.shape[-2] * pixels.shape[-1] // (vision.patch_size * vision.scale_factor) ** 2
    ids = head + [vision.image_token_id] * count + end + tokenizer.encode(after, add_special_tokens=False)
    return ImagePromptIds(ids, [ImageInput(hashlib.sha256(image).digest(), len(head), count, pixels.tobytes(),
                                           list(pixels.shape))])
