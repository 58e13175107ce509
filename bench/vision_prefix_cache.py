"""Images and the prefix cache: TTFT of a one-image prompt sent cold, then the same image again
(its blocks from the prefix cache: no tower, no prefill of the image; target <= 30% of cold),
and the tower's encode time; beside HF transformers' prefill of the same prompt and pixels (the
peer), rounds interleaved. In process (LLM API), a random-weight Gemma 3 vision model of 270M's
text width and a 224-pixel SigLIP (mlxr.testing.vlm_fixtures "gemma3-vlm-shape"). Writes
bench/results/<day>/vision_prefix_cache-*.json.

  python bench/vision_prefix_cache.py --device cpu --rounds 3
"""
from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
from common import cpu_model, device_name, median, print_table, write_result  # noqa: E402

TEXT = ("<bos><start_of_turn>user\nDescribe this picture in detail, then list the colours you see: "
        "<start_of_image><end_of_turn>\n<start_of_turn>model\n")


def picture(seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def ttft(llm, image: bytes) -> tuple[float, int]:
    from mlxr import ImagePrompt, SamplingParams

    before = llm.engine.stats().vision_encoder_calls
    t0 = time.perf_counter()
    llm.generate([ImagePrompt(TEXT, (image,))], SamplingParams(max_tokens=1, temperature=0))
    return time.perf_counter() - t0, llm.engine.stats().vision_encoder_calls - before


def encode_ms(llm, image: bytes) -> float:
    from mlxr.vision.image_prompt import image_prompt_ids
    from mlxr import ImagePrompt

    runner = llm.engine.core.core.runner
    prompt = image_prompt_ids(ImagePrompt(TEXT, (image,)), llm.engine.args.vision, llm.engine.tokenizer)
    im = prompt.images[0]
    pixels = torch.from_numpy(np.frombuffer(im.pixels, dtype=np.float32).reshape(1, *im.shape).copy()).to(runner.device)
    with torch.inference_mode():
        t0 = time.perf_counter()
        runner.model.encode_images(pixels.to(runner.images.dtype))
        return (time.perf_counter() - t0) * 1e3


def hf_prefill(hf, processor, llm, image: bytes) -> float:
    from PIL import Image

    from mlxr.vision.image_prompt import image_prompt_ids
    from mlxr import ImagePrompt

    ids = list(image_prompt_ids(ImagePrompt(TEXT, (image,)), llm.engine.args.vision, llm.engine.tokenizer))
    t0 = time.perf_counter()
    pixels = processor([Image.open(io.BytesIO(image))], return_tensors="pt")["pixel_values"].to(hf.device)
    t = torch.tensor([ids], device=hf.device)
    with torch.inference_mode():
        hf(input_ids=t, pixel_values=pixels, token_type_ids=(t == llm.engine.args.vision.image_token_id).long())
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from transformers import Gemma3ForConditionalGeneration
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from mlxr import LLM
    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    model_dir = vlm_fixture_dir("gemma3-vlm-shape", ROOT / ".fixtures")
    llm = LLM(str(model_dir), dtype=torch.float32, device=a.device)
    hf = Gemma3ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32,
                                                        attn_implementation="eager").to(a.device).eval()
    processor = Gemma3ImageProcessorPil.from_pretrained(model_dir)
    ttft(llm, picture(10_000))  # one-off costs of a first request
    rows = []
    for r in range(a.rounds):
        image = picture(r)
        cold, cold_calls = ttft(llm, image)
        warm, warm_calls = ttft(llm, image)
        peer = hf_prefill(hf, processor, llm, picture(100 + r))
        rows.append({"round": r, "cold_ttft_ms": cold * 1e3, "cached_ttft_ms": warm * 1e3,
                     "cached_over_cold": warm / cold, "encoder_calls_cold": cold_calls,
                     "encoder_calls_cached": warm_calls, "encode_ms": encode_ms(llm, image),
                     "hf_prefill_ms": peer * 1e3, "cold_over_hf": cold / peer})
    summary = {k: median([row[k] for row in rows]) for k in
               ("cold_ttft_ms", "cached_ttft_ms", "cached_over_cold", "encode_ms", "hf_prefill_ms", "cold_over_hf")}
    path = write_result("vision_prefix_cache", {"device": device_name(a.device), "cpu": cpu_model(),
                                                "model": "gemma3-vlm-shape", "rounds": rows, "median": summary})
    print_table(rows + [{"round": "median", **summary}], ["round", "cold_ttft_ms", "cached_ttft_ms", "cached_over_cold",
                                                          "encoder_calls_cold", "encoder_calls_cached", "encode_ms",
                                                          "hf_prefill_ms", "cold_over_hf"])
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
