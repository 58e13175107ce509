"""`mlxr serve --kv-cache-dir` on a hostile directory: block files replaced by a directory, a
FIFO, a symlink, a header nested 2,000 deep and a block forged from another text's, then the
same with a corrupt index. Each server answers /health, serves the prompt with the greedy text of
a server without the disk tier, counts the bad entries in /metrics by reason, and stops on
SIGTERM."""
from __future__ import annotations

import pytest

import os
import signal
import subprocess
import time

import httpx
import openai

import kv_dir_damage as damage
from model_fixtures import fixture_model
from server_harness import ROOT, free_port, scrape, server_command, server_process

PROMPT = list(range(5, 205))  # 12 full blocks of 16
OTHER = list(range(300, 500))
GRACE_S = 15.0


def complete(url: str, prompt: list[int]) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120)
    name = client.models.list().data[0].id
    return client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0).choices[0].text


def serve(home, *args: str, prompts=(PROMPT,)) -> tuple[list[str], dict[str, float], int | None]:
    """The texts for prompts, the /metrics samples after them, and how the server ended on SIGTERM."""
    gguf = str(fixture_model("tiny-llama").gguf_path)
    with server_process(home, "--model", gguf, *args) as (url, proc):
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        texts = [complete(url, p) for p in prompts]
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        metrics = scrape(url)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        try:
            code = proc.wait(GRACE_S)
        except Exception:  # noqa: BLE001 - the harness kills it; the assertion says why
            code = None
        assert code is not None and time.monotonic() - t0 < GRACE_S, "SIGTERM did not stop the server"
    return texts, metrics, code


def rejected(metrics: dict[str, float], reason: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("mlxr:kv_disk_rejected_total{") and f'reason="{reason}"' in k)


def damage_blocks(kv) -> None:
    layout_dir = next(p for p in kv.iterdir() if p.is_dir())
    ours = [(parent, tokens, layout_dir / f"{h.hex()}.kvb") for parent, tokens, h in damage.chain(PROMPT)]
    theirs = [layout_dir / f"{h.hex()}.kvb" for _, _, h in damage.chain(OTHER)]
    assert all(path.exists() for _, _, path in ours) and all(path.exists() for path in theirs)
    damage.directory(ours[1][2])
    damage.fifo(ours[3][2])
    damage.symlink_outside(ours[5][2])
    damage.deep_header(ours[7][2])
    parent, tokens, target = ours[9]
    damage.forge(theirs[9], target, parent, tokens)


@pytest.mark.slow  # two server starts on a forged cache dir, ~14 s; the in-process hostile-directory tests run every time
def test_server_on_a_hostile_cache_dir_answers_like_one_without_it(tmp_path):
    kv = tmp_path / "kv"
    reference, _, _ = serve(tmp_path / "plain")
    filled, _, _ = serve(tmp_path / "fill", "--kv-cache-dir", str(kv), prompts=(PROMPT, OTHER))
    assert filled[0] == reference[0]
    damage_blocks(kv)

    texts, metrics, code = serve(tmp_path / "hostile", "--kv-cache-dir", str(kv))
    assert texts == reference and code in (0, -signal.SIGTERM)
    assert rejected(metrics, "not_regular") >= 2 and rejected(metrics, "symlink") >= 1
    assert rejected(metrics, "corrupt") >= 1 and rejected(metrics, "forged") >= 1

    (kv / "index.sqlite").write_bytes(b"not an index" * 100)
    damage_blocks(kv)  # the blocks the last server recomputed and rewrote, damaged again
    texts, metrics, _ = serve(tmp_path / "corrupt-index", "--kv-cache-dir", str(kv))
    assert texts == reference
    assert rejected(metrics, "corrupt") >= 1 and rejected(metrics, "forged") >= 1  # the rebuilt index has them
    assert any("index" in line and "rebuilt" in line for line in (tmp_path / "corrupt-index" / "server.log").open())


def test_serve_refuses_a_cache_dir_others_can_write_before_loading(tmp_path):
    kv = tmp_path / "kv"
    kv.mkdir()
    kv.chmod(0o777)
    gguf = str(fixture_model("tiny-llama").gguf_path)
    cmd = server_command(tmp_path / "home", free_port(), "--model", gguf, "--kv-cache-dir", str(kv))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "MLXR_HOME": str(tmp_path / "home")})
    assert done.returncode == 2, done.stderr[-2000:]  # serve's own refusal, not a failed start-up
    assert done.stderr.startswith("error: kv_cache_dir: ") and "writable by group or others" in done.stderr
    assert "Traceback" not in done.stderr and not list(kv.iterdir())  # nothing was loaded or written
