"""Image encode ms and one-image TTFT against llama.cpp's multimodal path on the same files:
llama-mtmd-cli (libmtmd) with the GGUF + mmproj pair llama.cpp's converter writes of a
random-weight Gemma 3 vision model of 270M's text width and a 224-pixel SigLIP
(mlxr.testing.vlm_fixtures "gemma3-vlm-shape"), and MLXR loading the same two files. Rounds
interleave the two, each round a new picture (no prefix cache hit). MLXR's encode is the tower and
projector on the preprocessed pixels, its TTFT a one-token generate of the prompt libmtmd builds
(preprocessing included); llama-mtmd-cli's figures are its own log lines (`mtmd batch encoding
done in`, llama_perf's prompt eval time, which holds the encode), its model load left out.
Writes bench/results/<day>/vision_encode-*.json.

  python bench/vision_encode.py --device cpu --threads 2 --rounds 3
  python bench/vision_encode.py --device cuda --llama-bin /path/to/build-cuda/bin --rounds 5
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mlxr.config import openmp_environment  # noqa: E402

# As `mlxr` runs (set before torch loads): idle OpenMP threads sleep. Under libgomp's default they
# spin, taking the time slices a descheduled partner needs on a shared host (config.py says more).
os.environ.update(openmp_environment(os.environ))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from common import cpu_model, device_name, median, print_table, sync, write_result  # noqa: E402

QUESTION = "Describe this picture in detail, then list the colours you see."


def picture(seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def ours(llm, image: bytes, device: str) -> tuple[float, float, int]:
    """(encode ms, TTFT ms, image tokens) of one picture."""
    from mlxr import SamplingParams
    from mlxr.testing.llama_mtmd import gemma3_mtmd_ids

    runner = llm.engine.core.core.runner
    t0 = time.perf_counter()
    ids = gemma3_mtmd_ids(llm.tokenizer, llm.args.vision, QUESTION, image)
    llm.generate([ids], SamplingParams(max_tokens=1, temperature=0))
    ttft = (time.perf_counter() - t0) * 1e3
    im = ids.images[0]
    pixels = torch.from_numpy(np.frombuffer(im.pixels, dtype=np.float32).reshape(1, *im.shape).copy()).to(runner.device)
    with torch.inference_mode():
        sync(device)
        t0 = time.perf_counter()
        runner.model.encode_images(pixels.to(runner.images.dtype))
        sync(device)
        encode = (time.perf_counter() - t0) * 1e3
    return encode, ttft, im.length


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for both (torch, llama-mtmd-cli -t)")
    ap.add_argument("--llama-bin", type=Path, default=None, help="folder of llama-mtmd-cli (default: MLXR_LLAMA_BIN)")
    ap.add_argument("--ngl", type=int, default=None, help="llama-mtmd-cli -ngl (default: 99 with --device cuda)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from mlxr import LLM
    from mlxr.testing.llama_mtmd import BIN_DIR, mtmd_cli, run_mtmd
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm

    exe = mtmd_cli(a.llama_bin or BIN_DIR)
    if exe is None:
        raise SystemExit(f"no llama-mtmd-cli in {a.llama_bin or BIN_DIR}: give --llama-bin")
    torch.set_num_threads(a.threads)
    model, mmproj = llama_cpp_vlm("gemma3-vlm-shape", ROOT / ".fixtures")
    llm = LLM(str(model), dtype=torch.float32, device=a.device, mmproj=str(mmproj))
    ngl = a.ngl if a.ngl is not None else (99 if a.device.startswith("cuda") else 0)
    extra = ("-ngl", str(ngl)) if ngl else ()  # its warmup run stays on: the timed encode comes after it
    ours(llm, picture(10_000), a.device)  # one-off costs of a first request
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            path = Path(tmp) / f"picture-{r}.png"
            path.write_bytes(picture(100 + r))
            theirs = run_mtmd(exe, model, mmproj, path, QUESTION, 1, a.threads, extra)
            encode, ttft, tokens = ours(llm, picture(r), a.device)
            rows.append({"round": r, "load": os.getloadavg()[0], "image_tokens": tokens, "mtmd_image_tokens": theirs.image_tokens,
                         "encode_ms": encode, "mtmd_encode_ms": theirs.encode_ms, "encode_speedup": theirs.encode_ms / encode,
                         "ttft_ms": ttft, "mtmd_ttft_ms": theirs.prompt_ms, "ttft_speedup": theirs.prompt_ms / ttft})
    keys = ("encode_ms", "mtmd_encode_ms", "encode_speedup", "ttft_ms", "mtmd_ttft_ms", "ttft_speedup")
    summary = {k: median([row[k] for row in rows]) for k in keys}
    path = write_result("vision_encode", {"device": device_name(a.device), "cpu": cpu_model(), "threads": a.threads,
                                          "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                                          "load_average": os.getloadavg(),
                                          "model": "gemma3-vlm-shape (GGUF + mmproj, F32; the projector matrix F16)",
                                          "peer": f"{exe} -t {a.threads} {' '.join(extra)}", "rounds": rows,
                                          "median": summary})
    print_table(rows + [{"round": "median", **summary}], ["round", "load", "image_tokens", "mtmd_image_tokens", *keys])
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
