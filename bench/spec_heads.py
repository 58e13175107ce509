"""Model-head speculation (an EAGLE-3 head, an MTP layer) on a tiny target whose head the
fixture trains to copy it: tokens per verify step, acceptance per draft position, and decode
speed as a ratio to the same target without speculation, run interleaved in one process.

The target is tiny-llama with its attention outputs scaled by --scale (its next token leans
on the current one, so a one-layer head learns it in a few hundred CPU steps:
mlxr/testing/head_training.py); the heads are trained here, then served from their checkpoint
layouts. The qwen35-mtp row does the same for Qwen3.5's own MTP layer on tiny-qwen35 (hybrid:
DeltaNet and gated attention) with its token mixers' outputs scaled (qwen35_mtp_training.py).
Greedy output with a head must equal the plain engine's (checked, in the JSON).

With --server-bin, the qwen35-mtp row also runs llama.cpp's llama-server on the GGUF its own
converter writes from the trained checkpoint, plain and with --spec-type draft-mtp, in the same
rounds (bench/peers/llama_mtp.py).

    python bench/spec_heads.py --device cpu|cuda [--steps 300] [--rounds 3] [--prompts 8] [--max-tokens 64] [--k 4]
                               [--server-bin llama-server]
Writes bench/results/<date>/spec_heads-<stamp>.json."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import cpu_model, device_name, print_table, write_result  # noqa: E402
from mlxr import LLM, SamplingParams  # noqa: E402
from mlxr.testing.fixtures import fixture_paths  # noqa: E402
from mlxr.testing.head_fixtures import write_scaled_attention_target  # noqa: E402
from mlxr.testing.head_training import train_head  # noqa: E402
from mlxr.testing.hybrid_fixtures import hybrid_fixture_dir, write_scaled_mixer_target  # noqa: E402
from mlxr.testing.qwen35_mtp_training import train_qwen35_mtp  # noqa: E402
from mlxr.testing.llama_cpp_convert import convert, llama_cpp_tree  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from llama_mtp import PeerTally, llama_server, run_prompts  # noqa: E402
from llama_server import LlamaServer  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / ".fixtures"


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[list[list[int]], float, int]:
    """Each prompt alone (batch 1): (outputs, seconds, tokens)."""
    outs, t0 = [], time.perf_counter()
    for p in prompts:
        outs.append(llm.generate([p], params)[0].outputs[0].token_ids)
    return outs, time.perf_counter() - t0, sum(len(o) for o in outs)


def start_peers(a, head_dir: Path, gguf: Path) -> list[tuple[LlamaServer, PeerTally]]:
    """llama-server plain and with draft-mtp on llama.cpp's own conversion of head_dir."""
    convert(llama_cpp_tree(FIXTURES), head_dir, gguf, "f32")
    peers = []
    for drafts in (0, a.k):
        server = llama_server(a.server_bin, str(gguf), a.threads, drafts).__enter__()
        run_prompts(server, [[5, 6, 7]], 8, PeerTally())  # warm-up (its first request builds the graphs), not counted
        peers.append((server, PeerTally()))
    return peers


def peer_row(peers: list[tuple[LlamaServer, PeerTally]], want: list[list[int]]) -> dict:
    """llama.cpp's figures: tokens per target forward (its timings count drafts and kept drafts,
    not drafting steps: tokens over tokens less kept drafts, each forward emitting its kept drafts
    and one more), and the speed of draft-mtp against its own plain decode."""
    (_, plain), (_, mtp) = peers
    return {"tokens_per_forward": round(mtp.tokens / max(mtp.tokens - mtp.accepted, 1), 2),
            "acceptance": round(mtp.accepted / max(mtp.drafted, 1), 3),
            "plain_tok_s": round(plain.tokens / plain.seconds, 1), "mtp_tok_s": round(mtp.tokens / mtp.seconds, 1),
            "ratio": round(plain.seconds / mtp.seconds * mtp.tokens / max(plain.tokens, 1), 3),
            "greedy_identical_to_mlxr": plain.outputs == want and mtp.outputs == want}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=300, help="training steps of each head")
    ap.add_argument("--scale", type=float, default=0.05, help="the target's attention output scale")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4, help="draft tokens per step at most")
    ap.add_argument("--server-bin", default=None, help="llama-server: the qwen35-mtp row's peer")
    ap.add_argument("--threads", type=int, default=2, help="the peer's threads")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlxr-spec-heads-"))
    target = write_scaled_attention_target(fixture_paths("tiny-llama", FIXTURES).hf_dir, work / "target", a.scale)
    hybrid = write_scaled_mixer_target(hybrid_fixture_dir("tiny-qwen35", FIXTURES), work / "hybrid", a.scale)
    g = torch.Generator().manual_seed(7)
    prompts = torch.randint(3, 512, (a.prompts, 8), generator=g).tolist()
    params = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True)
    rows = []
    for name, kind, base in (("eagle3", "eagle3", target), ("mtp", "mtp", target), ("qwen35-mtp", "mtp", hybrid)):
        plain = LLM(str(base), dtype="float32", device=a.device)
        want = timed(plain, prompts, params)[0]
        t0 = time.perf_counter()
        if base is hybrid:
            head, agreement = train_qwen35_mtp(base, work / name, steps=a.steps, lr=1e-2)
        else:
            head, agreement = train_head(kind, base, work / name, steps=a.steps)
        train_s = time.perf_counter() - t0
        spec = LLM(str(head if kind == "mtp" else base), dtype="float32", device=a.device, speculative_method=kind,
                   speculative_model=str(head), num_speculative_tokens=a.k)
        peers = start_peers(a, head, work / f"{name}.gguf") if base is hybrid and a.server_bin else None
        before = spec.engine.stats()
        plain_s = spec_s = 0.0
        tokens = 0
        identical = True
        for _ in range(a.rounds):  # interleaved: plain, then the head (then llama.cpp's two), each round
            _, s, n = timed(plain, prompts, params)
            plain_s += s
            outs, s, n = timed(spec, prompts, params)
            spec_s += s
            tokens += n
            identical &= outs == want
            if peers is not None:
                for server, tally in peers:
                    run_prompts(server, prompts, a.max_tokens, tally)
        s = spec.engine.stats()
        drafts = s.spec_num_drafts - before.spec_num_drafts
        drafted = s.spec_num_draft_tokens - before.spec_num_draft_tokens
        accepted = s.spec_num_accepted_tokens - before.spec_num_accepted_tokens
        per_pos = [x - y for x, y in zip(s.spec_accepted_per_position, before.spec_accepted_per_position)]
        rows.append({"head": name, "train_s": round(train_s, 1), "train_agreement": round(agreement, 3),
                     "tokens_per_step": round(1 + accepted / max(drafts, 1), 2),
                     # over every target forward (prefills, steps without drafts): as llama.cpp's is counted
                     "tokens_per_forward": round(tokens / max(tokens - accepted, 1), 2),
                     "acceptance": round(accepted / max(drafted, 1), 3),
                     "accepted_per_position": [round(x / max(drafts, 1), 3) for x in per_pos],
                     "plain_tok_s": round(tokens / plain_s, 1), "head_tok_s": round(tokens / spec_s, 1),
                     "ratio": round(plain_s / spec_s, 3), "greedy_identical": identical})
        if peers is not None:
            rows[-1]["llama_cpp"] = peer_row(peers, want)
            for server, _ in peers:
                server.close()
        del spec, plain
    print_table(rows, ["head", "train_s", "train_agreement", "tokens_per_step", "tokens_per_forward", "acceptance",
                       "accepted_per_position", "plain_tok_s", "head_tok_s", "ratio", "greedy_identical"])
    path = write_result("spec_heads", {"device": device_name(a.device), "cpu": cpu_model(), "args": vars(a),
                                       "load_average": os.getloadavg(), "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
