"""The one reader of model-directory JSON files."""
import pytest

from mlxr.errors import ModelFormatError
from mlxr.formats.json_file import read_json_object


@pytest.mark.parametrize("content,message", [
    (b"{not json", "not valid JSON"), (b"[1, 2]", "JSON object"), (b"\xff\xfe", "not valid JSON"),
])
def test_bad_files_are_model_format_errors(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(ModelFormatError, match=message):
        read_json_object(path)


def test_size_bound_and_missing(tmp_path):
    path = tmp_path / "big.json"
    path.write_text('{"a": "' + "x" * 100 + '"}')
    with pytest.raises(ModelFormatError, match="larger than"):
        read_json_object(path, max_bytes=50)
    assert read_json_object(path)["a"].startswith("x")
    with pytest.raises(ModelFormatError, match="missing"):
        read_json_object(tmp_path / "absent.json")
