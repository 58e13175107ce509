"""Which sampling settings make the bundled models answer best: 20 fixed questions with known
one-word answers, each setting sampled --samples times per question (greedy once), scored as
the share of replies that contain an accepted answer. The chat model is asked through its chat
template, the base model by completion. `--server URL` instead asks a running `mlxr serve`
through /v1/chat/completions and /api/chat with no sampling fields at all (the defaults the
server ships) beside temperature 0. JSON to bench/results/<day>/sampling_presets-*.json.

  .venv/bin/python bench/sampling_presets.py                       # choose: every candidate, in-process
  .venv/bin/python bench/sampling_presets.py --server http://127.0.0.1:11434   # check the shipped defaults
"""
from __future__ import annotations

import argparse
import re

from common import cpu_model, print_table, write_result

# (question, completion prompt for the base model, accepted answers)
QUESTIONS = [
    ("What is the capital of France?", "The capital of France is", ["paris"]),
    ("How many days are there in a week?", "The number of days in a week is", ["7", "seven"]),
    ("What color is a clear daytime sky?", "On a clear day the colour of the sky is", ["blue"]),
    ("What is the opposite of hot?", "The opposite of hot is", ["cold"]),
    ("What is the largest planet in our solar system?", "The largest planet in the solar system is",
     ["jupiter"]),
    ("What is 2 + 2?", "2 + 2 =", ["4", "four"]),
    ("At what temperature in Celsius does water freeze?", "Water freezes at a temperature in Celsius of",
     ["0", "zero"]),
    ("Who wrote Romeo and Juliet?", "Romeo and Juliet was written by", ["shakespeare"]),
    ("Which farm animal says moo?", "The farm animal that says moo is the", ["cow"]),
    ("How many legs does a spider have?", "The number of legs a spider has is", ["8", "eight"]),
    ("What is the chemical formula of water?", "The chemical formula of water is", ["h2o", "h₂o"]),
    ("What is the first month of the year?", "The first month of the year is", ["january"]),
    ("What is the capital of Japan?", "The capital of Japan is", ["tokyo"]),
    ("What color is grass?", "The colour of grass is", ["green"]),
    ("How many continents are there on Earth?", "The number of continents on Earth is", ["7", "seven"]),
    ("What kind of object is the Sun?", "The Sun is a", ["star"]),
    ("At what temperature in Celsius does water boil at sea level?",
     "At sea level water boils at a temperature in Celsius of", ["100"]),
    ("What do bees make?", "Bees make", ["honey"]),
    ("What is the capital of Italy?", "The capital of Italy is", ["rome"]),
    ("What language is mainly spoken in Spain?", "The main language spoken in Spain is", ["spanish"]),
]

# Ollama option names; "openai-api" and "ollama-api" are what the APIs gave before presets.
CANDIDATES = {
    "greedy": {"temperature": 0.0},
    "openai-api": {"temperature": 1.0},
    "ollama-api": {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1},
    "t0.2-p0.9": {"temperature": 0.2, "top_p": 0.9},
    "t0.2-k40-p0.9-r1.1": {"temperature": 0.2, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1},
    "t0.4-k40-p0.9-r1.1": {"temperature": 0.4, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1},
    "t0.6-k20-p0.8-r1.05": {"temperature": 0.6, "top_k": 20, "top_p": 0.8, "repeat_penalty": 1.05},
}
MAX_TOKENS = 48


def correct(reply: str, answers: list[str]) -> bool:
    words = reply.lower()
    return any(re.search(rf"(?<![\w]){re.escape(a)}(?![\w])", words) for a in answers)


def _params(setting: dict, seed: int):
    from mlxr.loader.sampling_defaults import FIELDS
    from mlxr.types import SamplingParams

    ours = {FIELDS[k][0]: v for k, v in setting.items()}
    return SamplingParams(max_tokens=MAX_TOKENS, seed=seed, **ours)


def score_in_process(llm, chat: bool, setting: dict, samples: int) -> float:
    runs = 1 if setting.get("temperature", 1.0) == 0 else samples
    prompts, answers, params = [], [], []
    tok = llm.tokenizer
    for question, completion, accepted in QUESTIONS:
        text = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True) \
            if chat else completion
        ids = tok.encode(text, add_special_tokens=not chat)
        for seed in range(runs):
            prompts.append(ids)
            answers.append(accepted)
            params.append(_params(setting, seed))
    outs = llm.generate(prompts, params)
    hits = [correct(o.outputs[0].text, a) for o, a in zip(outs, answers)]
    return sum(hits) / len(hits)


def choose(samples: int, models: list[str]) -> list[dict]:
    from mlxr import LLM
    from mlxr.bundled_models import CHAT_MODEL, COMPLETION_MODEL

    rows = []
    for model, chat in ((CHAT_MODEL, True), (COMPLETION_MODEL, False)):
        if model.split(":")[0] not in models:
            continue
        llm = LLM(model)
        try:
            for name, setting in CANDIDATES.items():
                rows.append({"model": model, "setting": name, "score": round(score_in_process(
                    llm, chat, setting, samples), 3), **setting})
                print(rows[-1], flush=True)
        finally:
            llm.shutdown()
    return rows


def _ask(client, url: str, model: str, question: str, route: str, greedy: bool) -> str:
    messages = [{"role": "user", "content": question}]
    if route == "/v1/chat/completions":
        body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS}
        if greedy:
            body["temperature"] = 0
        r = client.post(url + route, json=body)
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"]
    body = {"model": model, "messages": messages, "stream": False, "options": {"num_predict": MAX_TOKENS}}
    if greedy:
        body["options"]["temperature"] = 0
    r = client.post(url + route, json=body)
    r.raise_for_status()
    return r.json()["message"]["content"]


def check_server(url: str, samples: int) -> list[dict]:
    import httpx

    from mlxr.bundled_models import CHAT_MODEL

    rows = []
    with httpx.Client(timeout=300) as client:
        for route in ("/v1/chat/completions", "/api/chat"):
            for greedy in (True, False):
                runs = 1 if greedy else samples
                hits = [correct(_ask(client, url, CHAT_MODEL, q, route, greedy), a)
                        for q, _, a in QUESTIONS for _ in range(runs)]
                rows.append({"model": CHAT_MODEL, "route": route,
                             "setting": "temperature 0" if greedy else "server defaults",
                             "score": round(sum(hits) / len(hits), 3), "replies": len(hits)})
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=5, help="sampled replies per question and setting")
    ap.add_argument("--server", help="a running server's URL: check its shipped defaults instead")
    ap.add_argument("--models", default="smollm2,gemma3-270m",
                    help="which bundled models to ask (gemma3-270m's 262k vocabulary makes it slow)")
    args = ap.parse_args()
    rows = check_server(args.server, args.samples) if args.server else choose(args.samples, args.models.split(","))
    columns = ["model", "route", "setting", "score"] if args.server else ["model", "setting", "score"]
    print_table(rows, columns)
    write_result("sampling_presets", {"cpu": cpu_model(), "samples": args.samples, "questions": len(QUESTIONS),
                                      "max_tokens": MAX_TOKENS, "server": args.server, "rows": rows})


if __name__ == "__main__":
    main()
