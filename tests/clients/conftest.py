"""One tool-template server for every real-client module (they only send it requests)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from client_server import tool_template_server


@pytest.fixture(scope="session")
def client_server_url(tmp_path_factory) -> Iterator[str]:
    with tool_template_server(tmp_path_factory.mktemp("clients")) as url:
        yield url
