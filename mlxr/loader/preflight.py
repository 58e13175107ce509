"""Before a model is registered (import, create, pull): will it load? The registry has read
the header and the architecture; this adds what only the loader knows, short of the weights:
the tensor names against the layer count and the tokenizer."""
from __future__ import annotations

from typing import Any

from mlxr.formats.json_file import check_text_file
from mlxr.formats.limits import check_layers_present
from mlxr.formats.safetensors_dir import tensor_names
from mlxr.loader.hf_model import hf_name, read_config
from mlxr.models.model_args import args_from_hf
from mlxr.tokenizer.tokenizer import Tokenizer


def check_loadable(facts: Any) -> None:
    """Raises ModelFormatError / UnsupportedModelError for a model that would not load."""
    if facts.format == "gguf":
        from mlxr.formats.gguf import open_gguf

        with open_gguf(facts.path) as f:
            Tokenizer.from_gguf_metadata(f.metadata)  # args_from_gguf checked the layers
        return
    args = args_from_hf(read_config(facts.path))
    names = [n for n in map(hf_name, tensor_names(facts.path)) if n is not None]
    check_layers_present(args.num_hidden_layers, names, "model.layers.", "the checkpoint")
    check_text_file(facts.path / "chat_template.jinja")
    Tokenizer.from_hf_dir(facts.path)
