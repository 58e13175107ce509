"""`mlxr run`'s conversation: messages, sampling parameters and Ollama's slash commands."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field

from mlxr.errors import MLXRError
from mlxr.types import ImagePrompt, SamplingParams

HELP = """Available commands:
  /set parameter NAME VALUE   set a sampling parameter, or num_thread (/set parameter lists them)
  /set system TEXT            set the system message
  /show info                  the model's facts
  /show parameters            the sampling parameters in use
  /show system                the system message
  /load MODEL                 load another model (starts a new conversation)
  /clear                      forget the conversation so far
  /bye                        exit
  /?, /help                   this help

Use \"\"\" to begin and end a multi-line message; Alt-Enter also starts a new line.
Ctrl-C stops a reply; Ctrl-D or /bye exits."""

# Ollama's parameter names -> (SamplingParams field, type). `stop` takes several words.
PARAMETERS = {
    "temperature": ("temperature", float), "top_k": ("top_k", int), "top_p": ("top_p", float),
    "min_p": ("min_p", float), "seed": ("seed", int), "num_predict": ("max_tokens", int),
    "repeat_penalty": ("repetition_penalty", float), "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float), "stop": ("stop", list),
}


class Exit(Exception):
    """/bye."""


@dataclass
class ChatSession:
    model: str
    llm: object
    params: SamplingParams
    system: str | None = None
    messages: list[dict] = field(default_factory=list)
    turns: int = 0

    def conversation(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def reply(self, text: str) -> None:
        from mlxr.cli.stream import print_stream
        from mlxr.vision.image_files import message_images, paths_in

        vision = self.llm.engine.args.vision
        text, paths = paths_in(text) if vision is not None else (text, [])
        for path in paths:
            print(f"Added image '{path}'", file=sys.stderr)
        parts = [{"type": "image", "image": p} for p in paths]
        self.messages.append({"role": "user", "content": parts + [{"type": "text", "text": text}] if parts else text})
        tok = self.llm.tokenizer
        messages, images = message_images(self.conversation(), vision.image_marker if vision else None)
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
        prompt = ImagePrompt(prompt, images, False) if images else tok.encode(prompt, add_special_tokens=False)
        self.turns += 1
        result = print_stream(self.llm.engine, f"chat-{self.turns}", prompt, self.params)
        self.messages.append({"role": "assistant", "content": result.text})


def run_command(session: ChatSession, line: str, load) -> None:
    """One slash command; load(model) -> LLM loads a model (with its spinner)."""
    words = line.split()
    verb, args = words[0], words[1:]
    if verb in ("/bye", "/exit", "/quit"):
        raise Exit
    if verb in ("/?", "/help"):
        print(HELP)
    elif verb == "/set":
        _set(session, line, args)
    elif verb == "/show":
        _show(session, args)
    elif verb == "/clear":
        session.messages.clear()
        print("Cleared session context")
    elif verb == "/load" and len(args) == 1:
        session.llm, session.model = load(args[0]), args[0]
        session.messages.clear()
        print(f"Loaded model '{args[0]}'")
    elif verb == "/load":
        print("Usage: /load MODEL")
    else:
        print(f"Unknown command '{verb}'. Type /? for help")


def _set(session: ChatSession, line: str, args: list[str]) -> None:
    if args[:1] == ["system"] and len(args) > 1:
        session.system = line.split("system", 1)[1].strip().strip('"')
        print("Set system message.")
    elif args[:2] == ["parameter", "num_thread"] and len(args) == 3:
        _set_threads(args[2])
    elif args[:1] == ["parameter"] and len(args) >= 3:
        name, values = args[1], args[2:]
        if name not in PARAMETERS:
            print(f"Unknown parameter '{name}'. Known: {', '.join(PARAMETERS)}")
            return
        key, kind = PARAMETERS[name]
        try:
            value = values if kind is list else kind(values[0])
            session.params = dataclasses.replace(session.params, **{key: value})
        except ValueError:
            print(f"error: {name} takes a {kind.__name__}, got {values[0]!r}")
            return
        except MLXRError as e:
            print(f"error: {e.message}")
            return
        print(f"Set parameter '{name}' to '{' '.join(values)}'")
    else:
        print("Usage:\n  /set parameter NAME VALUE  (" + ", ".join(PARAMETERS) + ", num_thread)\n  /set system TEXT")


def _set_threads(value: str) -> None:
    """num_thread: this process runs the model in the REPL's own thread, so it applies at once."""
    import torch

    if not value.isdecimal() or not 1 <= int(value) <= 1024:
        print(f"error: num_thread takes a whole number from 1 to 1024, got {value!r}")
        return
    torch.set_num_threads(int(value))
    print(f"Set parameter 'num_thread' to '{value}'")


def _show(session: ChatSession, args: list[str]) -> None:
    what = args[0] if args else ""
    if what == "info":
        loaded = session.llm.loaded
        a = loaded.args
        rows = [("architecture", a.model_type), ("layers", a.num_hidden_layers),
                ("context length", a.max_position_embeddings), ("embedding length", a.hidden_size),
                ("quantization", loaded.quantization), ("device", f"{loaded.device} ({loaded.dtype})")]
        print(f"  Model {session.model}\n" + "\n".join(f"    {k:<20}{v}" for k, v in rows))
    elif what == "parameters":
        import torch

        for ours, name in ((v[0], k) for k, v in PARAMETERS.items()):
            print(f"    {name:<20}{getattr(session.params, ours)}")
        print(f"    {'num_thread':<20}{torch.get_num_threads()}")
    elif what == "system":
        print(session.system or "No system message was specified.")
    else:
        print("Usage: /show info | parameters | system")


def chat_loop(model: str, ns: argparse.Namespace, params: SamplingParams) -> int:
    from mlxr.cli.line_reader import open_reader, read_message
    from mlxr.cli.options import model_path
    from mlxr.cli.progress import load_llm

    load = lambda ref: load_llm(model_path(ref), ns)  # noqa: E731
    session = ChatSession(model, load(model), params, ns.system)
    print(f"mlxr: chatting with {model}. /? for help, Ctrl-D or /bye to quit.", file=sys.stderr)
    reader = open_reader()
    while True:
        try:
            text = read_message(reader)
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:
            print("Use Ctrl-D or /bye to exit.", file=sys.stderr)
            continue
        try:
            if text.startswith("/"):
                run_command(session, text, load)
            elif text.strip():
                session.reply(text)
        except Exit:
            return 0
        except MLXRError as e:
            print(f"error: {e.message}", file=sys.stderr)
