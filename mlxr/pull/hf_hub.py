"""Hugging Face repositories through huggingface_hub (HF_ENDPOINT selects the hub): which
files a `hf.co/OWNER/REPO[:QUANT]` names, and fetching them into the models directory.

A GGUF repository gives the one file whose name carries the quant tag (Ollama's rule; no tag:
Q4_K_M, or the repository's only GGUF). Its `mmproj*.gguf` files are projectors, never the
model: the F16 (or BF16) one, else the first by name, is fetched beside the model and registered
as its projector, as `llama-server -hf` does. A repository without GGUF files gives a safetensors
checkpoint: config.json, the weights and the tokenizer files.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx2
from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError

from mlxr.errors import DownloadError, ModelNotFoundError, UnsupportedModelError
from mlxr.pull.download import Expected, fetch
from mlxr.pull.events import PullEvent, Report
from mlxr.pull.refs import HubRef

DEFAULT_QUANT = "Q4_K_M"  # Ollama's choice when the name has no tag
MAX_FILES = 128
_SAFE_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHARDED = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.I)
_CHECKPOINT_FILES = re.compile(
    r"(config\.json|generation_config\.json|tokenizer\.json|tokenizer_config\.json|tokenizer\.model|"
    r"special_tokens_map\.json|chat_template\.jinja|model\.safetensors\.index\.json|.+\.safetensors)")


@dataclass(frozen=True)
class HubFile:
    path: str  # relative to the repository root
    expected: Expected


@dataclass(frozen=True)
class Plan:
    commit: str
    files: tuple[HubFile, ...]
    gguf: bool  # one GGUF file, else a checkpoint directory
    projector: HubFile | None = None  # the GGUF's mmproj file, where the repository holds one


def plan(ref: HubRef) -> Plan:
    """Ask the hub for the repository's files (one model_info call) and pick ours."""
    try:
        info = HfApi().model_info(ref.repo_id, files_metadata=True)
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        if status in (401, 404):
            raise ModelNotFoundError(f"hf.co/{ref.repo_id} not found on the hub") from None
        raise DownloadError(f"the hub did not list hf.co/{ref.repo_id}: {e}") from None
    except httpx2.TransportError as e:  # no connection, a timeout: download() retries these, one listing does not
        raise DownloadError(f"cannot reach the hub for hf.co/{ref.repo_id}: {e}") from None
    if not isinstance(info.sha, str) or not _COMMIT.fullmatch(info.sha):
        raise DownloadError(f"the hub gave no commit for hf.co/{ref.repo_id}")
    siblings = [s for s in (info.siblings or []) if _safe_path(s.rfilename)][:10_000]
    ggufs = [s for s in siblings if s.rfilename.lower().endswith(".gguf")]
    projectors = [s for s in ggufs if _is_mmproj(s.rfilename)]
    models = [s for s in ggufs if not _is_mmproj(s.rfilename)]
    if projectors and not models:
        raise UnsupportedModelError(f"hf.co/{ref.repo_id} holds only projectors (mmproj files), no model")
    chosen = [_choose_gguf(ref, models)] if models else _checkpoint(ref, siblings)
    projector = _choose_projector(projectors) if models else None
    return Plan(info.sha, tuple(HubFile(s.rfilename, _expected(s)) for s in chosen), bool(models),
                HubFile(projector.rfilename, _expected(projector)) if projector is not None else None)


def download(ref: HubRef, p: Plan, models_dir: Path, report: Report) -> tuple[Path, Path | None]:
    """Fetch the plan's files under models_dir/hf.co/OWNER/REPO/COMMIT; returns (the GGUF file
    or the checkpoint directory, the projector beside the GGUF or None)."""
    root = models_dir / "hf.co" / ref.owner / ref.repo / p.commit
    for f in p.files + ((p.projector,) if p.projector is not None else ()):
        digest = f.expected.label
        status = f"pulling {digest.partition(':')[2][:12]}"
        url = hf_hub_url(ref.repo_id, f.path, revision=p.commit)
        try:
            fetch(url, root / f.path, f.expected,
                  lambda done, total, s=status, d=digest: report(PullEvent(s, d, total, done)),
                  lambda: report(PullEvent("verifying sha256 digest")))
        except HfHubHTTPError as e:
            raise DownloadError(f"the hub refused {f.path}: {e}") from None
    projector = root / p.projector.path if p.projector is not None else None
    return (root / p.files[0].path if p.gguf else root), projector


def _choose_gguf(ref: HubRef, ggufs: list) -> object:
    wanted = ref.quant or DEFAULT_QUANT
    tag = re.compile(rf"(?:^|[-._/]){re.escape(wanted.lower())}(?:$|[-._])")
    matches = [s for s in ggufs if tag.search(s.rfilename.lower().removesuffix(".gguf"))]
    if not matches and ref.quant is None and len(ggufs) == 1:
        matches = ggufs
    if not matches:
        tags = ", ".join(sorted(_tag_of(s.rfilename) for s in ggufs)[:20])
        raise ModelNotFoundError(f"hf.co/{ref.repo_id} has no GGUF file for {wanted!r} (its files: {tags})")
    whole = [s for s in matches if not _SHARDED.search(s.rfilename)]
    if not whole:
        raise UnsupportedModelError(f"{matches[0].rfilename} is split into parts; split GGUF files are not supported")
    if len(whole) > 1:
        raise ModelNotFoundError(f"{wanted!r} matches several files of hf.co/{ref.repo_id}: "
                                 + ", ".join(s.rfilename for s in whole[:5]))
    return whole[0]


def _is_mmproj(filename: str) -> bool:
    return PurePosixPath(filename).name.lower().startswith("mmproj")


def _choose_projector(projectors: list) -> object | None:
    ordered = sorted(projectors, key=lambda s: s.rfilename)
    half = [s for s in ordered if _tag_of(s.rfilename).lower() in ("f16", "bf16")]
    return (half or ordered or [None])[0]


def _checkpoint(ref: HubRef, siblings: list) -> list:
    files = [s for s in siblings if "/" not in s.rfilename and _CHECKPOINT_FILES.fullmatch(s.rfilename)]
    names = {s.rfilename for s in files}
    if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
        raise UnsupportedModelError(f"hf.co/{ref.repo_id} holds neither a GGUF file nor a safetensors checkpoint")
    if ref.quant is not None:
        raise ModelNotFoundError(f"hf.co/{ref.repo_id} has no GGUF files to pick {ref.quant!r} from")
    if len(files) > MAX_FILES:
        raise UnsupportedModelError(f"hf.co/{ref.repo_id} has more than {MAX_FILES} checkpoint files")
    return files


def _expected(sibling) -> Expected:
    if sibling.size is None:
        raise DownloadError(f"the hub listed no size for {sibling.rfilename}")
    if sibling.lfs is not None:
        return Expected(sibling.lfs.size, sha256=sibling.lfs.sha256)
    return Expected(sibling.size, git_sha1=sibling.blob_id)


def _tag_of(filename: str) -> str:
    return PurePosixPath(filename).stem.rsplit(".", 1)[-1].rsplit("-", 1)[-1]


def _safe_path(name: object) -> bool:
    if not isinstance(name, str):
        return False
    parts = name.split("/")
    return len(parts) <= 3 and all(_SAFE_PART.fullmatch(p) and ".." not in p for p in parts)
