"""A tiny random Gemma 3 mmproj GGUF (tests only), with the names and metadata llama.cpp's converter writes
for a Gemma 3 vision tower (conversion/gemma.py Gemma3VisionModel, MmprojModel): clip.projector_type gemma3,
clip.use_gelu, SigLIP tensors v.*, projector mm.soft_emb_norm (stored as 1 + w) and mm.input_projection."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from hitenter.testing.tiny_mmproj import mmproj_header


def write_tiny_gemma3_mmproj(path: str | Path, seed: int = 0, text_hidden: int = 64, hidden: int = 32,
                             ffn: int = 48, layers: int = 2, heads: int = 2, image_size: int = 64,
                             patch_size: int = 4, merge: int | None = None,
                             mean: tuple[float, float, float] = (0.5, 0.5, 0.5),
                             std: tuple[float, float, float] = (0.5, 0.5, 0.5)) -> Path:
    """Write a random Gemma 3 mmproj to `path` (F32 tensors; `merge` None leaves the scale factor key out,
    so readers take Gemma 3's default 4); return it. The output width is `text_hidden`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    mmproj_header(w, "tiny-gemma3-mmproj", gguf.VisionProjectorType.GEMMA3, text_hidden=text_hidden, hidden=hidden,
                  ffn=ffn, layers=layers, heads=heads, image_size=image_size, patch_size=patch_size, mean=mean, std=std)
    w.add_vision_use_gelu(True)
    if merge is not None:
        w.add_vision_projector_scale_factor(merge)

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ln(prefix: str, n: int) -> None:
        w.add_tensor(prefix + ".weight", (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32))
        w.add_tensor(prefix + ".bias", normal(n, std=0.05))

    n_patches = (image_size // patch_size) ** 2
    w.add_tensor("v.patch_embd.weight", normal(hidden, 3, patch_size, patch_size, std=0.2))
    w.add_tensor("v.patch_embd.bias", normal(hidden, std=0.05))
    w.add_tensor("v.position_embd.weight", normal(n_patches, hidden, std=0.2))
    for i in range(layers):
        p = f"v.blk.{i}."
        ln(p + "ln1", hidden)
        ln(p + "ln2", hidden)
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(p + name + ".weight", normal(hidden, hidden, std=0.25))
            w.add_tensor(p + name + ".bias", normal(hidden, std=0.05))
        w.add_tensor(p + "ffn_up.weight", normal(ffn, hidden, std=0.2))
        w.add_tensor(p + "ffn_up.bias", normal(ffn, std=0.05))
        w.add_tensor(p + "ffn_down.weight", normal(hidden, ffn, std=0.2))
        w.add_tensor(p + "ffn_down.bias", normal(hidden, std=0.05))
    ln("v.post_ln", hidden)
    w.add_tensor("mm.soft_emb_norm.weight", (1.0 + rng.standard_normal(hidden) * 0.1).astype(np.float32))
    w.add_tensor("mm.input_projection.weight", normal(hidden, text_hidden, std=0.2))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sample_image(width: int = 48, height: int = 40, seed: int = 0) -> np.ndarray:
    """A deterministic [height, width, 3] uint8 image with smooth gradients and noise (not square, so the
    aspect-preserving resize and padding are exercised)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([255 * x / max(width - 1, 1), 255 * y / max(height - 1, 1),
                     127 + 120 * np.sin((x + y) / 5.0)], axis=-1)
    noisy = base + rng.normal(0, 20, base.shape)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def write_tiny_gemma3_with_mmproj(folder: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """The tiny random Gemma 3 text model (tiny_gemma.write_tiny_gemma3) with its tiny mmproj beside it, as
    a model folder holds them (so find_mmproj picks it): (text path, mmproj path)."""
    from hitenter.testing.tiny_gemma import write_tiny_gemma3

    folder = Path(folder)
    text = write_tiny_gemma3(folder / "tiny-gemma3.gguf", seed=seed)
    return text, write_tiny_gemma3_mmproj(folder / "mmproj-tiny-gemma3.gguf", seed=seed)


def image_bytes(rgb: np.ndarray, fmt: str = "PNG") -> bytes:
    """`rgb` encoded in `fmt` (Pillow)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format=fmt)
    return buf.getvalue()


def image_base64(rgb: np.ndarray, fmt: str = "PNG") -> str:
    import base64

    return base64.b64encode(image_bytes(rgb, fmt)).decode()


def data_url(rgb: np.ndarray, fmt: str = "PNG") -> str:
    """A base64 data: URL of `rgb` in `fmt`."""
    return f"data:image/{fmt.lower()};base64,{image_base64(rgb, fmt)}"


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (8-bit RGB) over a few bytes of zeros: a decompression bomb
    when the sides are large."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def bad_images() -> dict[str, tuple[str, str]]:
    """Images every API must refuse with a 4xx, by name: (MIME type, base64 data). A bomb (a header of
    100000 x 100000 pixels), a truncated PNG, bytes that are no image, a PNG labelled image/jpeg, a type that
    is no image, data that is not base64, an empty image."""
    import base64

    good = image_bytes(sample_image(32, 24, 5))
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return {
        "bomb": ("image/png", b64(png_claiming(100_000, 100_000))),
        "truncated": ("image/png", b64(good[:len(good) // 2])),
        "malformed": ("image/png", b64(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)),
        "wrong_mime": ("image/jpeg", b64(good)),
        "not_an_image_type": ("text/plain", b64(b"hello")),
        "not_base64": ("image/png", "%%%not base64%%%"),
        "empty": ("image/png", ""),
    }
