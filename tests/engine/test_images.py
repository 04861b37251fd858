"""Images through the engine (tiny random Gemma 3 + its tiny mmproj, tests/goldens/vision/gemma3.npz from
scripts/make_vision_goldens.py): the prompt laid out as llama.cpp's mtmd lays it out, the per-position logits of
the prompt against llama.cpp's, chunked prefill / batching / the prefix cache keeping every row's bits, the
encoder run once per image (EncoderCache.runs), and the token budget never cutting an image."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from hitenter.engine.encoder_cache import EncoderCache
from hitenter.engine.llm_engine import LLMEngine
from hitenter.request import ImageRun
from hitenter.sampling_params import SamplingParams
from hitenter.testing.tiny_vision import sample_image, write_tiny_gemma3_with_mmproj

GOLDEN = Path(__file__).resolve().parents[1] / "goldens" / "vision" / "gemma3.npz"
TWO = GOLDEN.with_name("gemma3_two_images.npz")
PROMPT = "Look at this: <__media__> It shows a small cat on a red mat, and the sky is blue today."
GREEDY = SamplingParams(max_tokens=3, temperature=0.0)


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, golden: dict[str, np.ndarray]) -> tuple[Path, Path]:
    text, mmproj = write_tiny_gemma3_with_mmproj(tmp_path_factory.mktemp("gemma3_vision"))
    assert hashlib.sha256(text.read_bytes()).hexdigest() == str(golden["text_sha256"])
    assert hashlib.sha256(mmproj.read_bytes()).hexdigest() == str(golden["mmproj_sha256"])
    return text, mmproj


def _engine(files: tuple[Path, Path], **options: object) -> LLMEngine:
    return LLMEngine(str(files[0]), dtype="float32", **options)


class RowCapture:
    """The final hidden row of every position the engine computes for a request, through the model's
    forward (the first time each position is computed)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.model = engine.runner.model
        self.rows: dict[int, torch.Tensor] = {}
        self._forward = self.model.forward

        def forward(ids, pos, meta, kv, **kw):  # noqa: ANN001, ANN202
            h = self._forward(ids, pos, meta, kv, **kw)
            for p, row in zip(pos.tolist(), h, strict=False):
                self.rows.setdefault(p, row.clone())
            return h
        self.model.forward = forward

    def logits(self, n: int, start: int = 0) -> np.ndarray:
        """Logits of positions start..n-1."""
        h = torch.stack([self.rows[p] for p in range(start, n)])
        return self.model.compute_logits(h).double().numpy()


def _run(engine: LLMEngine, images: list[np.ndarray], prompt: str = PROMPT) -> tuple[list[int], int]:
    rid = engine.add_request(None, engine.image_prompt(prompt, images, add_bos=False), GREEDY)
    while True:
        for out in engine.step():
            if out.request_id == rid and out.finished:
                return list(out.outputs[0].token_ids), int(out.num_cached_tokens or 0)


@pytest.mark.slow
def test_prompt_layout_is_mtmds(files: tuple[Path, Path], golden: dict[str, np.ndarray]) -> None:
    eng = _engine(files)
    assert eng.vision is not None   # found beside the model (find_mmproj)
    ip = eng.image_prompt(PROMPT, [golden["image0"]], add_bos=False)
    (run,) = ip.runs
    ours = np.array(ip.ids)
    ours[run.start:run.end] = -1
    assert np.array_equal(ours, golden["prompt_tokens"])
    assert run.bidirectional and run.length == 16


@pytest.mark.slow
@pytest.mark.parametrize("budget", [2048, 32, 8])
def test_prompt_logits_match_llama_cpp(files: tuple[Path, Path], golden: dict[str, np.ndarray], budget: int) -> None:
    """Per-position logits of the prompt holding the image, computed by the engine's steps (budget 32: chunks
    end before the image; 8: the 16-row image runs alone, over the budget) against llama.cpp's mtmd."""
    eng = _engine(files, max_num_batched_tokens=budget)
    cap = RowCapture(eng)
    _run(eng, [golden["image0"]])
    tokens, ref = golden["prompt_tokens"], golden["prompt_logits"]
    ours = cap.logits(len(tokens))[tokens >= 0]
    agree = int((ours.argmax(-1) == ref.argmax(-1)).sum())
    assert len(ref) >= 40 and agree >= len(ref) - len(ref) // 40, f"{agree}/{len(ref)}"
    assert np.abs(ours - ref).max() <= 5e-3 * np.abs(ref).max()
    assert eng.vision.runs == 1


@pytest.mark.slow
@pytest.mark.parametrize("budget", [2048, 40, 16])
def test_two_images_match_llama_cpp(files: tuple[Path, Path], budget: int) -> None:
    """A prompt with two images (tests/goldens/vision/gemma3_two_images.npz, scripts/make_vision_prompt_goldens.py):
    the layout and the per-position logits against llama.cpp's, whole and in steps cut around each image; run
    again, the prefix cache serves both images (the encoder ran once per image) and the rows after the hit
    still match."""
    with np.load(TWO) as z:
        gold = {k: z[k] for k in z.files}
    assert hashlib.sha256(files[0].read_bytes()).hexdigest() == str(gold["text_sha256"])
    eng = _engine(files, max_num_batched_tokens=budget, block_size=16)
    images = [gold["image0"], gold["image1"]]
    ip = eng.image_prompt(str(gold["prompt"]), images, add_bos=False)
    ours = np.array(ip.ids)
    for run in ip.runs:
        ours[run.start:run.end] = -1
    tokens, ref = gold["tokens"], gold["logits"]
    assert np.array_equal(ours, tokens)
    for again in (False, True):
        cap = RowCapture(eng)
        _, cached = _run(eng, images, str(gold["prompt"]))
        assert (cached > ip.runs[1].end) == again and eng.vision.runs == 2
        got = cap.logits(len(tokens), cached)[tokens[cached:] >= 0]
        want = ref[int((tokens[:cached] >= 0).sum()):]
        agree = int((got.argmax(-1) == want.argmax(-1)).sum())
        assert (again or len(want) >= 40) and agree >= len(want) - len(want) // 40, f"{agree}/{len(want)}"
        assert np.abs(got - want).max() <= 5e-3 * np.abs(want).max()
        cap.model.forward = cap._forward


@pytest.mark.slow
def test_chunking_and_batching_keep_the_bits(files: tuple[Path, Path], golden: dict[str, np.ndarray]) -> None:
    """Every prompt row has the same bits whether the prompt runs whole, in chunks around the image, or in
    one step beside another image request and a text-only one."""
    def rows(budget: int, company: bool) -> np.ndarray:
        eng = _engine(files, max_num_batched_tokens=budget, enable_prefix_caching=False)
        cap = RowCapture(eng)
        rid = eng.add_request(None, eng.image_prompt(PROMPT, [golden["image0"]], add_bos=False), GREEDY)
        if company:   # submitted after: their rows follow in the same steps
            eng.add_request(None, eng.image_prompt("Two <__media__> here", [golden["image1"]], add_bos=False), GREEDY)
            eng.add_request(None, "Some plain text beside the images", GREEDY)
        done: set[str] = set()
        while eng.has_unfinished_requests():
            done |= {o.request_id for o in eng.step() if o.finished}
        assert rid in done
        return torch.stack([cap.rows[p] for p in range(len(golden["prompt_tokens"]))]).numpy()

    whole = rows(2048, False)
    for budget, company in ((2048, True), (30, False), (24, True)):
        assert np.array_equal(rows(budget, company), whole), (budget, company)


@pytest.mark.slow
def test_second_request_hits_the_prefix_cache_without_the_encoder(files: tuple[Path, Path],
                                                                     golden: dict[str, np.ndarray]) -> None:
    eng = _engine(files, block_size=16)
    first, cached = _run(eng, [golden["image0"]])
    assert cached == 0 and eng.vision.runs == 1
    again, cached = _run(eng, [golden["image0"]])
    run = eng.image_prompt(PROMPT, [golden["image0"]], add_bos=False).runs[0]
    assert again == first
    assert cached >= run.end and eng.vision.runs == 1   # the image's blocks came from the cache
    # another image with the same token ids: its blocks hash differently, so no hit past the image's start
    other, cached = _run(eng, [golden["image2"]])
    assert cached <= run.start and eng.vision.runs == 2


def test_encoder_cache_is_a_bounded_lru() -> None:
    class Counting:
        def __init__(self) -> None:
            self.calls = 0

        def encode(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return x.repeat(2, 1)

    enc = Counting()
    cache = EncoderCache(enc, capacity=2)
    runs = [ImageRun(0, 2, bytes([i]) * 16, torch.full((1, 3), float(i))) for i in range(3)]
    cache.rows(runs[0])
    cache.rows(runs[1])
    assert torch.equal(cache.rows(runs[0]), torch.zeros(2, 3)) and enc.calls == 2 and cache.hits == 1
    cache.rows(runs[2])                   # evicts runs[1], the least recently used
    assert runs[0].key in cache and runs[1].key not in cache and len(cache) == 2
    cache.rows(runs[1])
    assert enc.calls == 4 and cache.runs == 4
    with pytest.raises(ValueError, match="rows for an image of 3 tokens"):
        cache.rows(ImageRun(0, 3, b"x" * 16, torch.zeros(1, 3)))


def test_no_encoder_names_the_fix(files: tuple[Path, Path]) -> None:
    eng = _engine(files, mmproj="none")
    assert eng.vision is None
    with pytest.raises(ValueError, match="--mmproj"):
        eng.image_prompt(PROMPT, [sample_image()])


def test_a_named_mmproj_must_fit(files: tuple[Path, Path], tmp_path: Path) -> None:
    from hitenter.errors import ModelLoadError
    from hitenter.testing.tiny_vision import write_tiny_gemma3_mmproj

    wrong = write_tiny_gemma3_mmproj(tmp_path / "mmproj-wide.gguf", text_hidden=32)
    with pytest.raises(ModelLoadError, match="hidden size 64"):
        _engine(files, mmproj=str(wrong))
    eng = _engine(files, mmproj=str(files[1]))
    assert eng.vision is not None


def test_marker_count_must_match(files: tuple[Path, Path]) -> None:
    eng = _engine(files)
    with pytest.raises(ValueError, match="1 image markers .* for 2 images"):
        eng.image_prompt(PROMPT, [sample_image(), sample_image()])


@pytest.fixture()
def scheduler_with_image() -> Iterator[tuple[object, ImageRun]]:
    from hitenter.config import SchedulerConfig
    from hitenter.engine.scheduler import Scheduler
    from hitenter.kv_cache.manager import KVCacheManager

    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=12, max_model_len=256), KVCacheManager(64, 4))
    yield sched, ImageRun(5, 8, b"k" * 16, None, True)


def _request(rid: str, n: int, images: tuple[ImageRun, ...]) -> object:
    from hitenter.request import Request

    req = Request(rid, list(range(1, n + 1)), GREEDY, 2)
    req.images = images
    return req


def test_scheduler_never_cuts_an_image_and_counts_the_encoder(scheduler_with_image: tuple) -> None:
    sched, img = scheduler_with_image
    req = _request("a", 20, (img,))
    sched.add_request(req)
    out = sched.schedule()            # 12 tokens would cut the image at 12: the step ends at its start
    assert [(s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled] == [(0, 5)]
    sched.update(out, {})
    out = sched.schedule()            # rows 5..13 cost 8 + 8 (encoder) > 12: alone, the image runs over budget
    assert [(s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled] == [(5, 8)]
    assert out.num_batched_tokens == 16
    sched.update(out, {})
    sched.encoded = lambda key: key == img.key
    out = sched.schedule()
    assert [(s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled] == [(13, 7)]


def test_an_encoded_image_costs_its_rows_only(scheduler_with_image: tuple) -> None:
    sched, img = scheduler_with_image
    sched.encoded = lambda key: True
    sched.add_request(_request("a", 20, (img,)))
    out = sched.schedule()            # 0..12 would cut the image (5..13): 5 rows, then next step 8 + 4
    assert [(s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled] == [(0, 5)]
    sched.update(out, {})
    out = sched.schedule()
    assert [(s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled] == [(5, 12)]


@pytest.mark.slow
def test_preempted_image_requests_give_the_same_tokens(files: tuple[Path, Path], golden: dict[str, np.ndarray]) -> None:
    """Three image requests in a KV cache that holds one: preempted ones recompute (prefix hits end at an
    image's start, never inside it) and answer as they do with room to spare."""
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    def answers(**options: object) -> tuple[list[list[int]], int]:
        eng = _engine(files, block_size=16, **options)
        ids = [eng.add_request(None, eng.image_prompt(PROMPT, [golden[f"image{i}"]], add_bos=False), params)
               for i in range(3)]
        outs: dict[str, list[int]] = {}
        while eng.has_unfinished_requests():
            outs.update({o.request_id: list(o.outputs[0].token_ids) for o in eng.step() if o.finished})
        return [outs[i] for i in ids], eng.scheduler.stats.num_preemptions

    roomy, _ = answers()
    tight, preemptions = answers(kv_cache_memory=2048 * 16 * 16)   # 16 blocks: one 256-token window
    assert preemptions > 0 and tight == roomy
