"""Teacher-forced top-1 agreement with llama.cpp on the same GGUF, over real text (CPU).

Both engines tokenize the text (the token ids must be identical); llama.cpp evaluates it once
with logits for every position, and MLXR's greedy next token is taken after every prefix
through the public LLM API (prefix caching makes each step a short prefill). JSON to
bench/results/llama_cpp_agreement-*.json.

llama-cpp-python is not a project dependency (it compiles llama.cpp); install it apart and
point --site (or MLXR_LLAMA_CPP_SITE) at its site-packages, as for bench/peers/llama_cpp_cpu.py:
  .venv/bin/python bench/peers/llama_cpp_agreement.py --models smollm2:135m gemma3-270m --site DIR
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# The opening of the United States Declaration of Independence (1776; public domain).
TEXT = (
    "When in the Course of human events, it becomes necessary for one people to dissolve the "
    "political bands which have connected them with another, and to assume among the powers of "
    "the earth, the separate and equal station to which the Laws of Nature and of Nature's God "
    "entitle them, a decent respect to the opinions of mankind requires that they should "
    "declare the causes which impel them to the separation.\n\n"
    "We hold these truths to be self-evident, that all men are created equal, that they are "
    "endowed by their Creator with certain unalienable Rights, that among these are Life, "
    "Liberty and the pursuit of Happiness. That to secure these rights, Governments are "
    "instituted among Men, deriving their just powers from the consent of the governed, That "
    "whenever any Form of Government becomes destructive of these ends, it is the Right of the "
    "People to alter or to abolish it, and to institute new Government, laying its foundation "
    "on such principles and organizing its powers in such form, as to them shall seem most "
    "likely to effect their Safety and Happiness. Prudence, indeed, will dictate that "
    "Governments long established should not be changed for light and transient causes; and "
    "accordingly all experience hath shewn, that mankind are more disposed to suffer, while "
    "evils are sufferable, than to right themselves by abolishing the forms to which they are "
    "accustomed. But when a long train of abuses and usurpations, pursuing invariably the same "
    "Object evinces a design to reduce them under absolute Despotism, it is their right, it is "
    "their duty, to throw off such Government, and to provide new Guards for their future "
    "security."
)


def add_site(site: str | None) -> None:
    site = site or os.environ.get("MLXR_LLAMA_CPP_SITE")
    if site:
        sys.path.insert(0, site)


def measure(model: str, text: str = TEXT, threads: int = 2, probes: list[str] = ()) -> dict:
    """Tokenization equality (on `text` and on each of `probes`, special tokens parsed) and
    top-1 agreement of MLXR with llama.cpp on `model`'s file."""
    import numpy as np
    from llama_cpp import Llama

    from mlxr import LLM, SamplingParams
    from mlxr.loader.resolve import resolve_model

    path = resolve_model(model).path
    ours = LLM(model, max_num_seqs=1)
    ids = ours.tokenizer.encode(text)
    peer = Llama(str(path), n_ctx=2 * len(ids) + 16, n_batch=512, n_threads=threads,
                 n_threads_batch=threads, logits_all=True, verbose=False)
    peer_ids = peer.tokenize(text.encode("utf-8"), add_bos=ours.tokenizer.add_bos_token, special=False)
    peer.eval(peer_ids)
    theirs = np.asarray(peer.scores[: len(peer_ids)]).argmax(-1)
    greedy = SamplingParams(max_tokens=1, temperature=0)
    mine = [ours.generate([ids[: i + 1]], greedy)[0].outputs[0].token_ids[0] for i in range(len(ids) - 1)]
    n = min(len(mine), len(theirs) - 1)
    agree = sum(int(a == b) for a, b in zip(mine[:n], theirs[:n].tolist()))
    differ = [t for t in probes if ours.tokenizer.encode(t, add_special_tokens=False)
              != peer.tokenize(t.encode("utf-8"), add_bos=False, special=True)]
    hf = _hf_top1(path, ids)[:n]
    on_f32 = _llama_cpp_f32_top1(path, peer_ids, threads)[:n]
    return {"model": model, "file": path.name, "tokens": len(ids), "same_tokens": ids == peer_ids,
            "positions": n, "top1_agreement": agree / n, "threads": threads,
            "mlxr_vs_llama_cpp_on_f32_copy_top1": sum(int(a == b) for a, b in zip(mine[:n], on_f32)) / n,
            "llama_cpp_vs_its_f32_copy_top1": sum(int(a == b) for a, b in zip(theirs[:n].tolist(), on_f32)) / n,
            "mlxr_vs_hf_fp32_top1": sum(int(a == b) for a, b in zip(mine[:n], hf)) / n,
            "llama_cpp_vs_hf_fp32_top1": sum(int(a == b) for a, b in zip(theirs[:n].tolist(), hf)) / n,
            "probe_texts": len(probes), "probe_texts_tokenized_differently": differ}


def _llama_cpp_f32_top1(path: Path, ids: list[int], threads: int) -> list[int]:
    """llama.cpp's greedy next tokens on an F32 copy of the file that llama.cpp's own quantizer
    wrote (every weight dequantized): its quantized dot products round the activations to 8
    bits, its F32 path does not, so this separates that rounding from the rest of the math."""
    import ctypes
    import tempfile

    import llama_cpp
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        f32 = str(Path(tmp) / "f32.gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = 0, True, threads  # 0: LLAMA_FTYPE_ALL_F32
        if llama_cpp.llama_model_quantize(str(path).encode(), f32.encode(), ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama.cpp could not write an F32 copy of {path}")
        peer = llama_cpp.Llama(f32, n_ctx=2 * len(ids) + 16, n_batch=512, n_threads=threads,
                               n_threads_batch=threads, logits_all=True, verbose=False)
        peer.eval(ids)
        return np.asarray(peer.scores[: len(ids)]).argmax(-1).tolist()


def _hf_top1(path: Path, ids: list[int]) -> list[int]:
    """Greedy next token after every position from HF transformers on the same GGUF,
    dequantized to fp32: the third opinion when the two engines disagree."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.inference_mode():
        return hf.eval()(torch.tensor([ids])).logits[0].argmax(-1).tolist()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="*", default=["smollm2:135m"])
    p.add_argument("--site", default=None, help="site-packages holding llama_cpp")
    p.add_argument("--threads", type=int, default=2)
    ns = p.parse_args()
    add_site(ns.site)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_path  # noqa: F401,I001  (bench/ on sys.path: common)
    from common import cpu_model, print_table, write_result

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from tokenizer_texts import TEXTS

    rows = [measure(m, threads=ns.threads, probes=TEXTS) for m in ns.models]
    print_table(rows, ["model", "tokens", "same_tokens", "positions", "top1_agreement", "probe_texts"])
    print(write_result("llama_cpp_agreement", {"cpu": cpu_model(), "rows": rows}))


if __name__ == "__main__":
    main()
