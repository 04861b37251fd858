#!/usr/bin/env bash
# Build llama.cpp's native `llama-server` from the llama.cpp vendored in the llama-cpp-python sdist,
# i.e. the same llama.cpp that the llama-cpp-python baseline (bench/vs_llamacpp.py) runs. Used by
# `bench/serving.py --llama-server-bin PATH`. Not a dependency of hitenter or its tests.
#
#   bash bench/build_llama_server.sh [OUT_DIR]        # default OUT_DIR=/work/llama-server
#
# Needs cmake, a C++17 compiler and pip (PyPI). Prints the binary's path as the last line; skips the
# build when the binary is already there. Env: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), JOBS (2),
# PIP (pip to download the sdist with; default: python3 -m pip).
set -euo pipefail

OUT=$(realpath -m "${1:-/work/llama-server}")
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${JOBS:-2}
SRC="$OUT/llama_cpp_python-$VERSION"
LLAMA="$SRC/vendor/llama.cpp"
BUILD="$LLAMA/build"
BIN="$BUILD/bin/llama-server"

if [[ -x "$BIN" ]]; then
    echo "llama-server already built" >&2
    echo "$BIN"
    exit 0
fi

command -v cmake >/dev/null || { echo "cmake not found (apt-get install cmake, or pip install cmake)" >&2; exit 1; }
mkdir -p "$OUT"

SDIST="$OUT/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
    # pip's cache (~/.cache/pip) is used when it holds the file.
    read -r -a PIP_CMD <<< "${PIP:-python3 -m pip}"
    "${PIP_CMD[@]}" download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$OUT" >&2
fi
if [[ ! -f "$LLAMA/CMakeLists.txt" ]]; then
    tar -xzf "$SDIST" -C "$OUT"
fi

# LLAMA_CURL is deprecated and ignored in this llama.cpp (it has its own HTTP client); the web UI
# would otherwise be downloaded from a hub at build time, so both UI paths are off (the server then
# embeds an empty asset table; the API is unaffected). OpenSSL is only needed for HTTPS downloads.
start=$(date +%s)
cmake -S "$LLAMA" -B "$BUILD" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF >&2
cmake --build "$BUILD" -j"$JOBS" --target llama-server >&2
echo "built in $(( $(date +%s) - start )) s" >&2

[[ -x "$BIN" ]] || { echo "build finished but $BIN is missing" >&2; exit 1; }
echo "$BIN"
