"""POST /playground/api/image on the tiny random Gemma 3 + its tiny mmproj: every number the image panel
draws against the engine's own parts, run apart (a second LLMEngine on the same files): the patch grid from
the mmproj, the token count from the encoder's prepare, the projected rows' norms from its encode, the image's
place in the prompt from the engine's image_prompt layout of the same chat, and the traced answer against the
engine's own greedy tokens for that prompt. Bad images, and a model without a projector, are 400s."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hitenter.engine.image_prompt import MEDIA_MARKER, chat_segments
from hitenter.engine.llm_engine import LLMEngine
from hitenter.sampling_params import SamplingParams
from hitenter.server.api import create_app
from hitenter.testing.tiny_vision import bad_images, data_url, sample_image, write_tiny_gemma3_with_mmproj

pytestmark = pytest.mark.slow      # three tiny engines and a traced forward: a few seconds
TEXT = "What is in this picture?"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_gemma3_with_mmproj(tmp_path_factory.mktemp("vision_pg"))


@pytest.fixture(scope="module")
def client(files: tuple[Path, Path], tiny_llama_path: Path):
    app = create_app(LLMEngine(str(files[0])), "vision", extra_engines={"tiny": LLMEngine(str(tiny_llama_path))})
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _reference(files: tuple[Path, Path], rgb, generate: int) -> tuple[LLMEngine, object, list[int]]:
    """The same chat laid out and answered greedily by an engine of its own."""
    eng = LLMEngine(str(files[0]))
    segs = chat_segments(eng.tokenizer, [{"role": "user", "content": MEDIA_MARKER + TEXT}], True)
    prompt = eng.image_prompt(segs, [rgb], add_bos=False)
    rid = eng.add_request(None, prompt, SamplingParams(max_tokens=generate, temperature=0.0))
    while True:
        for out in eng.step():
            if out.request_id == rid and out.finished:
                return eng, prompt, list(out.outputs[0].token_ids)


def test_image_path_numbers_are_the_engines(client: TestClient, files: tuple[Path, Path]) -> None:
    rgb = sample_image(48, 40, 3)
    r = client.post("/playground/api/image", json={"model": "vision", "image": data_url(rgb), "text": TEXT, "generate": 3})
    assert r.status_code == 200, r.text
    j = r.json()
    eng, prompt, answer = _reference(files, rgb, 3)
    enc = eng.vision.encoder
    cfg, inp = enc.config, enc.prepare(rgb)
    side = cfg.image_size // cfg.patch_size
    assert j["patch_grid"] == [side, side] and j["patches"] == side * side == 256
    assert j["tokens"] == inp.num_tokens == 16 and j["token_grid"] == [4, 4]
    norms = enc.encode(inp).norm(dim=-1).tolist()
    assert j["norms"] == pytest.approx(norms, rel=1e-5, abs=1e-6)
    run = prompt.runs[0]
    assert j["run"] == {"start": run.start, "length": run.length} and j["count"] == len(prompt)
    assert [None if p is None else p["id"] for p in j["sequence"]] == \
        [None if run.start <= i < run.end else t for i, t in enumerate(prompt.ids)]
    # the traced answer (the prompt's rows with the image's) is the engine's own greedy answer
    assert j["answer_ids"] == answer
    layers = eng.model_config.num_layers
    for a, tid in zip(j["attention"], answer, strict=True):
        assert a["piece"]["id"] == tid and len(a["layers"]) == layers and len(a["layers"][0]) == 16
        assert all(0.0 <= s <= 1.0 + 1e-5 for s in a["share"])
        assert [sum(row) for row in a["layers"]] == pytest.approx(a["share"], abs=2e-3)
    assert any(s > 0 for a in j["attention"] for s in a["share"])


def test_models_say_which_has_a_projector(client: TestClient) -> None:
    got = {m["name"]: m["vision"] for m in client.get("/playground/api/models").json()}
    assert got == {"vision": True, "tiny": False}


@pytest.mark.parametrize("name", sorted(bad_images()))
def test_bad_images_are_400s(client: TestClient, name: str) -> None:
    mime, b64 = bad_images()[name]
    r = client.post("/playground/api/image", json={"model": "vision", "image": f"data:{mime};base64,{b64}", "generate": 0})
    assert r.status_code == 400, (name, r.status_code, r.text)


@pytest.mark.parametrize("image", ["https://example.com/cat.png", "", "data:image/png;base64,AAAA"])
def test_other_refusals(client: TestClient, image: str) -> None:
    r = client.post("/playground/api/image", json={"model": "vision", "image": image})
    assert r.status_code == 400, r.text


def test_a_model_without_a_projector_names_mmproj(client: TestClient) -> None:
    r = client.post("/playground/api/image", json={"model": "tiny", "image": data_url(sample_image(8, 8, 0))})
    assert r.status_code == 400 and "--mmproj" in r.text
