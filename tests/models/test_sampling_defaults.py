"""A model's own sampling defaults: read from generation_config.json and GGUF's
general.sampling.* keys, out-of-range values skipped, and the precedence file < preset <
Modelfile."""
from __future__ import annotations

import json
from pathlib import Path

import gguf

from mlxr.bundled_models import BUNDLED_SAMPLING, CHAT_MODEL
from mlxr.loader.sampling_defaults import SamplingDefaults, file_defaults, model_sampling_defaults
from mlxr.registry.settings import ModelSettings


def _hf_dir(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    return tmp_path


def test_generation_config_values_become_defaults(tmp_path):
    d = file_defaults(_hf_dir(tmp_path, {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                         "repetition_penalty": 1.05, "eos_token_id": 2}), "safetensors")
    assert d.values == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repeat_penalty": 1.05}
    assert set(d.sources.values()) == {"generation_config.json"}
    assert d.ours() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05}


def test_greedy_generation_config_and_bad_values_give_no_defaults(tmp_path):
    assert file_defaults(_hf_dir(tmp_path, {"do_sample": False, "temperature": 0.6}), "safetensors").values == {}
    odd = file_defaults(_hf_dir(tmp_path, {"temperature": "hot", "top_p": 7.0, "top_k": 2.5, "min_p": 0.05}),
                        "safetensors")
    assert odd.values == {"min_p": 0.05}


def test_gguf_sampling_keys_become_defaults(tmp_path):
    path = tmp_path / "s.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_float32(gguf.Keys.General.SAMPLING_TEMP, 0.25)
    w.add_int32(gguf.Keys.General.SAMPLING_TOP_K, 30)
    w.add_float32(gguf.Keys.General.SAMPLING_PENALTY_REPEAT, 1.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    d = file_defaults(path, "gguf")
    assert d.values["top_k"] == 30 and abs(d.values["temperature"] - 0.25) < 1e-6
    assert abs(d.values["repeat_penalty"] - 1.1) < 1e-6 and set(d.sources.values()) == {"gguf"}


class _Record:
    def __init__(self, name: str, path: Path, settings: ModelSettings) -> None:
        self.name, self.path, self.format, self.settings = name, path, "safetensors", settings


def test_preset_then_modelfile_win_over_the_files(tmp_path, monkeypatch):
    root = _hf_dir(tmp_path, {"temperature": 0.9, "top_p": 0.5})
    monkeypatch.setitem(BUNDLED_SAMPLING, "m:latest", {"temperature": 0.3, "top_k": 40})
    record = _Record("m:latest", root, ModelSettings(parameters={"top_k": 10, "stop": ["x"]}))
    d = model_sampling_defaults(record)
    assert d.values == {"temperature": 0.3, "top_p": 0.5, "top_k": 10}
    assert d.sources == {"temperature": "preset", "top_p": "generation_config.json", "top_k": "Modelfile"}
    assert SamplingDefaults().get("temperature", 1.0) == 1.0 and d.get("temperature", 1.0) == 0.3
    assert d.parameters_text().splitlines() == ["temperature 0.3", "top_p 0.5", "top_k 10"]
    plain = model_sampling_defaults(replace_record(record, "other:latest"))
    assert plain.values == {"temperature": 0.9, "top_p": 0.5, "top_k": 10}


def replace_record(record: _Record, name: str) -> _Record:
    return _Record(name, record.path, record.settings)


def test_the_bundled_chat_model_ships_a_measured_preset():
    # Chosen by bench/sampling_presets.py (its JSON in bench/results/): greedy-or-better answers.
    preset = BUNDLED_SAMPLING[CHAT_MODEL]
    assert 0 < preset["temperature"] <= 0.5 and set(preset) <= {"temperature", "top_k", "top_p", "min_p",
                                                                "repeat_penalty"}
