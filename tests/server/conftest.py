"""One plain tiny-llama server for the whole session, shared by the modules that only send it
requests (no flags of their own, nothing they leave behind that another checks: the OpenAI
module, which asserts the metrics of its own requests, starts its own)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from server_harness import tiny_llama_server


@pytest.fixture(scope="session")
def shared_tiny_llama_url(tmp_path_factory) -> Iterator[str]:
    with tiny_llama_server(tmp_path_factory.mktemp("shared-home")) as url:
        yield url
