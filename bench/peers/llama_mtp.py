"""llama.cpp's own MTP speculation (llama-server --spec-type draft-mtp) beside MLXR's, on the GGUF
its converter writes from the same checkpoint (the MTP layer kept): each prompt alone, greedy,
the tokens, wall seconds and llama-server's draft counts (timings.draft_n, draft_n_accepted).
bench/spec_heads.py's qwen35-mtp row runs it interleaved with MLXR's rounds (--server-bin)."""
from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field

from llama_server import LlamaServer


@dataclass
class PeerTally:
    seconds: float = 0.0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    outputs: list[list[int]] = field(default_factory=list)


def llama_server(binary: str, gguf: str, threads: int, mtp_drafts: int) -> LlamaServer:
    """A CPU llama-server on gguf (f32 K/V, as the agreement tests run it); mtp_drafts > 0: with
    draft-mtp speculation of that many tokens at most."""
    extra = ["-ctk", "f32", "-ctv", "f32"]
    if mtp_drafts:
        extra += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(mtp_drafts)]
    return LlamaServer(binary, gguf, False, threads, 512, extra)


def run_prompts(server: LlamaServer, prompts: list[list[int]], max_tokens: int, tally: PeerTally) -> list[list[int]]:
    """Each prompt alone (batch 1); its wall time, tokens and drafts added to tally."""
    outs = []
    for prompt in prompts:
        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                "return_tokens": True, "ignore_eos": True}
        req = urllib.request.Request(server.url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        reply = json.loads(urllib.request.urlopen(req, timeout=300).read())
        tally.seconds += time.perf_counter() - t0
        timings = reply.get("timings", {})
        tally.tokens += len(reply["tokens"])
        tally.drafted += timings.get("draft_n", 0)
        tally.accepted += timings.get("draft_n_accepted", 0)
        outs.append(reply["tokens"])
    tally.outputs = outs
    return outs
