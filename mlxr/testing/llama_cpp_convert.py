"""llama.cpp's own converter (convert_hf_to_gguf.py with its gguf-py), run on fixture directories.

The converter comes from the llama.cpp tree inside the llama-cpp-python sdist (PyPI), unpacked
once under the fixtures root; its code is never part of MLXR. It runs in a subprocess with its
own gguf-py first on the path, so it checks MLXR's GGUF loader against an independent writer.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = "llama-cpp-python==0.3.36"
_MEMBERS = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion/", "gguf-py/")
LORA_CONVERTER = "convert_lora_to_gguf.py"
# The fixture tokenizers are trained here, so the converter's table of known pre-tokenizer
# hashes cannot know them: they split as GPT-2 does, which is what the fallback names ("default"
# for encoders' WordPiece / unigram vocabularies). Decoder fixtures are BPE tokenizer.json files
# only, so a converter asking for a SentencePiece model gets them instead (bpe_vocab).
_DRIVER = """
import runpy, sys
root, fallback, bpe_vocab = sys.argv.pop(1), sys.argv.pop(1), sys.argv.pop(1) == "1"
sys.path[:0] = [root, root + "/gguf-py"]
import conversion.base as base
known = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return fallback
base.TextModel.get_vocab_base_pre = pre
# Converters that expect a SentencePiece tokenizer.model (Gemma 2, Phi-3) take the fixture's BPE files.
import conversion
known_class = conversion.get_model_class
def model_class(*args, **kwargs):
    cls = known_class(*args, **kwargs)
    vocab = cls.set_vocab
    def set_vocab(self):
        if (self.dir_model / "tokenizer.model").is_file():
            return vocab(self)
        return self._set_vocab_gpt2()
    cls.set_vocab = set_vocab
    return cls
if bpe_vocab:
    conversion.get_model_class = model_class
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
runpy.run_path(root + "/convert_hf_to_gguf.py", run_name="__main__")
"""


class ConverterUnavailable(RuntimeError):
    pass


def llama_cpp_tree(root: Path, need: str = "convert_hf_to_gguf.py") -> Path:
    """The unpacked converter under root (downloading the sdist once, without its dependencies);
    a tree unpacked before it held `need` gets a second one beside it."""
    tree = Path(root) / "llama.cpp"
    if (tree / need).is_file():
        return tree
    if tree.is_dir():
        tree = Path(root) / f"llama.cpp-{Path(need).stem}"
        if (tree / need).is_file():
            return tree
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", SDIST, "--no-binary", ":all:", "--no-deps",
               "-q", "-d", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            raise ConverterUnavailable(f"pip download {SDIST} failed: {res.stderr[-500:]}")
        staged = Path(tmp) / "llama.cpp"
        _unpack(sdists[0], staged)
        try:
            os.rename(staged, tree)
        except OSError:
            if not tree.is_dir():
                raise
    return tree


def _unpack(sdist: Path, dest: Path) -> None:
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 3)  # llama_cpp_python-X/vendor/llama.cpp/<path>
            if len(parts) == 4 and parts[1:3] == ["vendor", "llama.cpp"] and parts[3].startswith(_MEMBERS):
                member.name = parts[3]
                tar.extract(member, dest, filter="data")


def convert(tree: Path, hf_dir: Path, out: Path, outtype: str = "f32", flags: tuple[str, ...] = (),
            pre_fallback: str = "gpt-2", bpe_vocab: bool = True) -> Path:
    """hf_dir -> out with llama.cpp's converter (flags: more of its options); raises with its log
    on failure. pre_fallback: the pre-tokenizer a fixture's unknown tokenizer hash gets; bpe_vocab:
    converters that want a SentencePiece model read the BPE tokenizer.json instead."""
    tmp = out.with_name(f".tmp-{os.getpid()}-{out.name}")
    cmd = [sys.executable, "-c", _DRIVER, str(tree), pre_fallback, "1" if bpe_vocab else "0", str(hf_dir),
           "--outfile", str(tmp), "--outtype", outtype, *flags]
    env = {**os.environ, "NO_LOCAL_GGUF": "1"}  # the driver puts the tree's gguf-py first itself
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if res.returncode != 0 or not tmp.is_file():
        raise RuntimeError(f"convert_hf_to_gguf.py failed on {hf_dir}:\n{res.stderr[-3000:]}")
    shutil.move(tmp, out)
    return out


def convert_lora(tree: Path, adapter_dir: Path, base_hf_dir: Path, out: Path, outtype: str = "f32") -> Path:
    """A PEFT adapter -> a GGUF LoRA with llama.cpp's convert_lora_to_gguf.py (the base's
    config from base_hf_dir); raises with its log on failure."""
    tmp = out.with_name(f".tmp-{os.getpid()}-{out.name}")
    driver = _DRIVER.replace("convert_hf_to_gguf.py", LORA_CONVERTER)
    cmd = [sys.executable, "-c", driver, str(tree), "gpt-2", "0", str(adapter_dir), "--base", str(base_hf_dir),
           "--outfile", str(tmp), "--outtype", outtype]
    env = {**os.environ, "NO_LOCAL_GGUF": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if res.returncode != 0 or not tmp.is_file():
        raise RuntimeError(f"{LORA_CONVERTER} failed on {adapter_dir}:\n{res.stderr[-3000:]}")
    shutil.move(tmp, out)
    return out


def llama_cpp_lora_gguf(adapter_dir: Path, base_hf_dir: Path, root: Path, outtype: str = "f32") -> Path:
    """llama.cpp's GGUF LoRA of a PEFT adapter directory, written once beside it."""
    out = Path(adapter_dir).parent / f"{Path(adapter_dir).name}-llama-cpp-{outtype}.gguf"
    if not out.is_file():
        convert_lora(llama_cpp_tree(Path(root), LORA_CONVERTER), Path(adapter_dir), Path(base_hf_dir), out, outtype)
    return out


def llama_cpp_gguf(hf_dir: Path, root: Path, outtype: str = "f32", options: tuple[str, ...] = ()) -> Path:
    """llama.cpp's GGUF of a fixture directory, written once beside it; options: the converter's
    further flags (`--no-mtp` for a Qwen3.5 checkpoint without its multi-token-prediction layer)."""
    out = Path(hf_dir).parent / f"llama-cpp-{outtype}.gguf"
    if not out.is_file():
        convert(llama_cpp_tree(Path(root)), Path(hf_dir), out, outtype, options)
    return out
