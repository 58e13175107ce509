"""Every curl of README.md's "Use" section, run as written against a real `mlxr serve` of the
bundled models: each ends within its bound with a 200 and some text. The Gemma /api/generate
example is the one a new user found never ending; it must end in under 10 s."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_harness import running_server

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 60.0  # any README example
GENERATE_BOUND_S = 10.0  # the base model's /api/generate example


def use_section_curls(readme: str) -> list[list[str]]:
    """The curl commands of the "Use" section's first indented code block, as argument lists."""
    section = readme.split("\n## Use\n", 1)[1]
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("    "))
    block = []
    for line in lines[first:]:
        if line.strip() and not line.startswith("    "):
            break
        block.append(line[4:])
    words = shlex.split("\n".join(block).replace("\\\n", " "), comments=True)
    starts = [i for i, w in enumerate(words) if w == "curl"]
    return [words[a:b] for a, b in zip(starts, [*starts[1:], len(words)])]


def reply_text(body: str) -> str:
    """The generated or scored text of any of the APIs' answers (JSON, or NDJSON lines)."""
    texts = []
    for line in filter(None, body.splitlines()):
        obj = json.loads(line)
        assert not obj.get("error"), obj
        for choice in obj.get("choices", []):
            texts.append((choice.get("message") or {}).get("content") or choice.get("text") or "")
        texts += [obj.get("response") or "", (obj.get("message") or {}).get("content") or ""]
        texts += [part.get("text", "") for item in obj.get("output", []) for part in item.get("content", [])]
    return "".join(texts)


def test_the_section_has_the_examples() -> None:
    curls = use_section_curls((ROOT / "README.md").read_text())
    assert len(curls) >= 5 and all(any("localhost:11434" in w for w in c) for c in curls)
    assert any(w.endswith("/api/generate") for c in curls for w in c)


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("home"), timeout_s=300) as url:
        yield url


@pytest.mark.slow  # the two bundled models load: about a minute on 2 cores
@pytest.mark.parametrize("curl", use_section_curls((ROOT / "README.md").read_text()), ids=lambda c: c[1].split("/", 1)[1])
def test_readme_curl_ends_with_an_answer(base_url: str, curl: list[str]) -> None:
    generate = any(w.endswith("/api/generate") for w in curl)
    bound = GENERATE_BOUND_S if generate else BOUND_S
    host = base_url.removeprefix("http://")
    args = [re.sub(r"\blocalhost:11434\b", host, w) for w in curl]
    start = time.monotonic()
    done = subprocess.run([*args, "-sS", "-w", "\n%{http_code}"], capture_output=True, text=True,
                          timeout=BOUND_S + 60)
    took = time.monotonic() - start
    body, _, status = done.stdout.rstrip("\n").rpartition("\n")
    assert done.returncode == 0 and status == "200", (args, done.stdout[-500:], done.stderr)
    assert took < bound, f"{args[1]} took {took:.1f} s: {body.splitlines()[-1][:400]}"
    assert reply_text(body).strip()
