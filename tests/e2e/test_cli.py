"""`mlxr generate` and `mlxr run` as a user runs them (subprocesses)."""
from __future__ import annotations

import pytest

import subprocess
import sys
from pathlib import Path

from model_fixtures import fixture_model

MLXR = [str(Path(sys.executable).parent / "mlxr")]


def run(args, **kw):
    return subprocess.run(MLXR + args, capture_output=True, text=True, timeout=120, **kw)


def test_generate_prints_the_completion():
    from mlxr import LLM, SamplingParams

    path = str(fixture_model("tiny-llama").gguf_path)
    res = run(["generate", "--model", path, "--max-tokens", "6", "Once upon a time"])
    assert res.returncode == 0, res.stderr
    want = LLM(path).generate("Once upon a time", SamplingParams(max_tokens=6, temperature=0))[0].outputs[0].text
    assert res.stdout == want + "\n"


def test_generate_reports_a_missing_model_cleanly():
    res = run(["generate", "--model", "/nonexistent/model.gguf", "hi"])
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == "error: no such file or directory: /nonexistent/model.gguf"


def test_run_chats_and_streams_until_bye():
    path = str(fixture_model("tiny-llama").gguf_path)
    res = run(["run", path, "--max-tokens", "5"], input="Hello there\nAnd again\n/bye\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(">>> ") == 3  # two turns answered, then the prompt that read /bye
    assert "chatting with" in res.stderr


def test_bench_profile_breaks_a_step_into_ops(tmp_path):
    import json

    path = str(fixture_model("tiny-llama").gguf_path)
    out = tmp_path / "bench.json"
    res = run(["bench", "--model", path, "--prompt-len", "16", "--gen-len", "4", "--profile", "--json", str(out)])
    assert res.returncode == 0, res.stderr
    figures = json.loads(out.read_text())
    ops = {row["op"]: row for row in figures["profile"]}
    assert {"attention (paged)", "attn matmuls", "mlp matmuls", "lm_head", "rmsnorm"} <= set(ops)
    assert ops["attention (paged)"]["calls"] == 2 * figures["profiled_forwards"]  # two layers a pass
    assert figures["profiled_forwards"] == figures["steps"] == 3  # decode only: gen 4, first token in prefill
    assert figures["decode_tok_s"] > 0 and "ms/step" in res.stdout


def test_bench_profile_of_a_quantized_gguf_times_its_matmuls(tmp_path):
    import json

    path = str(fixture_model("tiny-llama", "q8_0").gguf_path)
    out = tmp_path / "bench.json"
    res = run(["bench", "--model", path, "--prompt-len", "16", "--gen-len", "3", "--profile", "--json", str(out)])
    assert res.returncode == 0, res.stderr
    ops = {row["op"]: row for row in json.loads(out.read_text())["profile"]}
    assert ops["mlp matmuls"]["calls"] > 0 and ops["attn matmuls"]["calls"] > 0


def test_generate_finds_registry_names(tmp_path):
    import os

    env = {**os.environ, "MLXR_HOME": str(tmp_path)}
    path = str(fixture_model("tiny-llama").gguf_path)
    assert run(["import", path, "--name", "tiny:test"], env=env).returncode == 0
    by_name = run(["generate", "--model", "tiny:test", "--max-tokens", "4", "Hello"], env=env)
    by_path = run(["generate", "--model", path, "--max-tokens", "4", "Hello"], env=env)
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout == by_path.stdout


def test_run_commands_from_a_pipe():
    from mlxr import LLM, SamplingParams

    path = str(fixture_model("tiny-llama").gguf_path)
    other = str(fixture_model("tiny-qwen2").gguf_path)
    greedy = LLM(path).chat([{"role": "user", "content": "two\nlines"}],
                            SamplingParams(max_tokens=5, temperature=0)).outputs[0].text
    script = ["/?", "/set parameter temperature 0", "/set parameter top_k many", "/set parameter nope 1",
              '"""two', 'lines"""', "/show info", "/set parameter num_thread 1", "/show parameters", "/frobnicate", f"/load {other}",
              "/show info", "/bye", "never read"]
    res = run(["run", path, "--max-tokens", "5", "--temperature", "1.5"], input="\n".join(script) + "\n")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "/set parameter NAME VALUE" in out and "/bye" in out  # the help
    assert "Set parameter 'temperature' to '0'" in out
    assert "top_k takes a int, got 'many'" in out and "Unknown parameter 'nope'" in out
    assert greedy + "\n" in out  # the multi-line message, answered at temperature 0
    assert out.count("architecture        llama") == 1 and "architecture        qwen2" in out
    assert "temperature         0.0" in out and "Unknown command '/frobnicate'" in out
    assert f"Loaded model '{other}'" in out
    assert "Set parameter 'num_thread' to '1'" in out and "num_thread          1\n" in out


def test_generate_streams_while_the_engine_runs():
    """Text reaches stdout step by step, not once at the end."""
    import io

    from mlxr import LLM, SamplingParams
    from mlxr.cli.stream import print_stream

    llm = LLM(str(fixture_model("tiny-llama").gguf_path))

    class Recorder(io.StringIO):
        busy_writes = 0

        def write(self, s: str) -> int:
            if s and llm.engine.has_unfinished():
                Recorder.busy_writes += 1
            return super().write(s)

    out, old = Recorder(), sys.stdout
    sys.stdout = out
    try:
        result = print_stream(llm.engine, "s-1", "Once upon a time",
                              SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    finally:
        sys.stdout = old
    assert Recorder.busy_writes >= 2 and out.getvalue() == result.text + "\n"
    assert not result.interrupted


def test_load_progress_counts_every_tensor():
    from mlxr import LLM

    seen: list[tuple[int, int]] = []
    LLM(str(fixture_model("tiny-llama").gguf_path), load_progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == list(range(1, len(seen) + 1))


def test_the_test_session_keeps_out_of_the_real_home():
    import os

    home = Path(os.environ["MLXR_HOME"])
    assert not home.is_relative_to(Path.home()) and not Path(os.environ["MLXR_CACHE_DIR"]).is_relative_to(Path.home())
    # A name that is not a path is looked up in the registry, which the lookup creates.
    res = run(["generate", "--model", "no-such-model:latest", "hi"])
    assert res.returncode == 2 and (home / "registry.db").exists()


def _bench_threads(tmp_path, *args, env):
    import json

    out = tmp_path / "b.json"
    res = run(["bench", "--model", str(fixture_model("tiny-llama").gguf_path), "--prompt-len", "4", "--gen-len", "2",
               "--json", str(out), *args], env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text())


@pytest.mark.slow  # ~12 s of CLI runs: the default suite keeps under 15 minutes
def test_threads_option_environment_and_default(tmp_path):
    import os

    base = {k: v for k, v in os.environ.items() if k not in ("MLXR_NUM_THREADS", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    default = _bench_threads(tmp_path, env=base)
    assert default["threads"] == len(os.sched_getaffinity(0)) and default["omp_wait_policy"] == "PASSIVE"
    assert _bench_threads(tmp_path, "--threads", "1", env=base)["threads"] == 1
    assert _bench_threads(tmp_path, env={**base, "MLXR_NUM_THREADS": "1"})["threads"] == 1
    mine = _bench_threads(tmp_path, "--threads", "1", env={**base, "MLXR_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"})
    assert mine["threads"] == 1 and mine["omp_wait_policy"] == "ACTIVE"  # the option and the user's policy win
    bad = run(["generate", "--model", "x", "hi"], env={**base, "MLXR_NUM_THREADS": "many"})
    assert bad.returncode == 2 and "MLXR_NUM_THREADS" in bad.stderr and "Traceback" not in bad.stderr
