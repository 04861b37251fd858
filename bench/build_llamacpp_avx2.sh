#!/usr/bin/env bash
# Build the llama.cpp that llama-cpp-python 0.3.36 vendors as shared libraries (libllama.so + the ggml
# libraries) for AVX2 only: AVX-512, AVX-VNNI and AMX off, no -march=native. It is the fair llama.cpp
# baseline for hitenter forced to AVX2 (bench/hybrid_kernels.py --configs avx2 --llamacpp-lib DIR,
# bench/vs_llamacpp_rounds.py --llamacpp-lib DIR): llama-cpp-python loads DIR/libllama.so when
# LLAMA_CPP_LIB_PATH=DIR. Not a dependency of hitenter or its tests.
#
#   bash bench/build_llamacpp_avx2.sh [SRC_DIR] [BUILD_DIR]
#
# SRC_DIR: a llama.cpp source tree (default: the sdist's vendor/llama.cpp under /work/scratch/sdist, as
# bench/build_llama_server.sh unpacks it). BUILD_DIR: default SRC_DIR/build-avx2. Prints the folder
# holding libllama.so and the ggml libraries as the last line. Env: JOBS (2), NICE (19).
set -euo pipefail

SRC=$(realpath "${1:-/work/scratch/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp}")
BUILD=$(realpath -m "${2:-$SRC/build-avx2}")
JOBS=${JOBS:-2}
NICE=${NICE:-19}
[[ -f "$SRC/CMakeLists.txt" ]] || { echo "no llama.cpp source at $SRC" >&2; exit 1; }
command -v cmake >/dev/null || { echo "cmake not found (apt-get install cmake, or pip install cmake)" >&2; exit 1; }

start=$(date +%s)
cmake -S "$SRC" -B "$BUILD" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=OFF \
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DGGML_AVX_VNNI=OFF \
    -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF >&2
nice -n "$NICE" cmake --build "$BUILD" -j"$JOBS" --target llama >&2
echo "built in $(( $(date +%s) - start )) s" >&2

LIB=$(dirname "$(find "$BUILD" -name libllama.so -print -quit)")
[[ -f "$LIB/libllama.so" ]] || { echo "build finished but libllama.so is missing under $BUILD" >&2; exit 1; }
# llama-cpp-python dlopens libllama.so from LLAMA_CPP_LIB_PATH; its ggml libraries resolve through the
# library's RUNPATH (the build tree); copy them beside it as well so the folder stands alone.
find "$BUILD" -name 'libggml*.so*' -not -path "$LIB/*" -exec cp -a {} "$LIB/" \;
echo "$LIB"
