#!/usr/bin/env bash
# Builds the pinned llama.cpp (the source the llama-cpp-python 0.3.36 sdist vendors: commit 0c1e570,
# ggml 0.25.3) as shared libraries, then libggml-ssmk.so against it and libssmk.so.
# Everything lands in $SSMK_LLAMA_DIR (default target/llama-cpp) and is reused on the next run:
#   venv/   cmake, ninja and scikit-build-core from PyPI (the sdist's metadata step needs the last)
#   src/    vendor/llama.cpp of the sdist
#   build/  the llama.cpp build (only the targets below: llama-bench, llama-server and the tests)
#   ssmk/   libggml-ssmk.so, ssmk-llama-check, ssmk-op-bench and a libssmk.so.0 link to cargo's libssmk.so
#           (or to $SSMK_LIB_DIR/libssmk.so)
# Prints the paths as shell assignments on its last lines (LLAMA_BIN=..., SSMK_GGML_LIB=..., ...).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
dir=${SSMK_LLAMA_DIR:-$root/target/llama-cpp}
version=0.3.36
commit=0c1e57098bba43ac29e6e3b677cdceebdd22334f
mkdir -p "$dir"
cd "$dir"

if [ ! -x venv/bin/ninja ] || [ ! -x venv/bin/cmake ]; then
  python3 -m venv venv
  venv/bin/pip install -q cmake ninja scikit-build-core
fi
export PATH=$dir/venv/bin:$PATH

if [ ! -f src/ssmk-commit ]; then
  sdist=llama_cpp_python-$version.tar.gz
  [ -f "$sdist" ] || venv/bin/pip download -q --no-deps --no-binary :all: --no-build-isolation \
    "llama-cpp-python==$version" -d .
  rm -rf src "llama_cpp_python-$version"
  tar xzf "$sdist" "llama_cpp_python-$version/vendor/llama.cpp"
  mv "llama_cpp_python-$version/vendor/llama.cpp" src
  rm -rf "llama_cpp_python-$version"
  echo "$commit" > src/ssmk-commit
fi
# test-llama-archs's model writer, patched (that test program only, not the libraries under test):
# the lane's random RWKV-7 / ARWKV-7 models (it lacks their hyperparameters and skips them, "FIXME
# RWKV models hang indefinitely", which the lane does not see), and model sizes from SSMK_ARCHS_*
# variables for bench-llama.sh. A tree with an older version of the patch gets the file afresh.
if ! grep -q SSMK_ARCHS_N_EMBD src/tests/test-llama-archs.cpp; then
  tar xzf "llama_cpp_python-$version.tar.gz" -O "llama_cpp_python-$version/vendor/llama.cpp/tests/test-llama-archs.cpp" \
    >src/tests/test-llama-archs.cpp
  patch -s -p1 -d src < "$root/cbindings/ggml/test-llama-archs.patch"
fi

# Tools, tests and the server (no examples, no TLS or download code); a tree configured before
# the server was added is configured again.
if [ ! -f build/build.ninja ] || ! grep -q 'LLAMA_BUILD_SERVER:BOOL=ON' build/CMakeCache.txt; then
  cmake -S src -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >/dev/null
fi
nice -n 5 ninja -C build ${SSMK_LLAMA_TARGETS:-ggml ggml-base ggml-cpu llama test-backend-ops test-llama-archs llama-bench llama-server}

# libssmk.so: the one in $SSMK_LIB_DIR when given (.ci/llama-lane passes the release build the
# Python wheel's test made), else cargo's release build (incremental); then the backend and the
# checker, rebuilt when a source is newer.
if [ -n "${SSMK_LIB_DIR:-}" ]; then
  ssmk_lib=$SSMK_LIB_DIR
else
  (cd "$root" && nice -n 5 cargo build --release --lib --quiet)
  ssmk_lib=${CARGO_TARGET_DIR:-$root/target}/release
fi
mkdir -p ssmk
# The backend finds libssmk by its SONAME next to itself ($ORIGIN).
ln -sfn "$ssmk_lib/libssmk.so" ssmk/libssmk.so.0
here=$root/cbindings/ggml
flags=(-std=c++17 -O2 -Wall -Wextra -Werror -fPIC -I "$dir/src/include" -I "$dir/src/ggml/include"
  -I "$dir/src/ggml/src" -I "$root/include" -L "$dir/build/bin" -L "$ssmk_lib"
  -Wl,-rpath,"$dir/build/bin" -Wl,-rpath,'$ORIGIN')
newer() { [ ! -f "$1" ] || [ -n "$(find "${@:2}" -newer "$1" 2>/dev/null)" ]; }
if newer ssmk/libggml-ssmk.so "$here/ggml-ssmk.cpp" "$root/include/ssmk.h" "$dir/build/bin/libggml-base.so"; then
  nice -n 5 g++ "${flags[@]}" -shared "$here/ggml-ssmk.cpp" -o ssmk/libggml-ssmk.so -lggml-base -lssmk
fi
if newer ssmk/ssmk-llama-check "$here/ssmk-llama-check.cpp" "$dir/build/bin/libllama.so"; then
  nice -n 5 g++ "${flags[@]}" "$here/ssmk-llama-check.cpp" -o ssmk/ssmk-llama-check -lllama -lggml -lggml-base
fi
if newer ssmk/ssmk-op-bench "$here/ssmk-op-bench.cpp" "$dir/build/bin/libggml.so"; then
  nice -n 5 g++ "${flags[@]}" "$here/ssmk-op-bench.cpp" -o ssmk/ssmk-op-bench -lggml -lggml-base
fi
echo "LLAMA_BIN=$dir/build/bin"
echo "SSMK_GGML_LIB=$dir/ssmk/libggml-ssmk.so"
echo "SSMK_LLAMA_CHECK=$dir/ssmk/ssmk-llama-check"
echo "SSMK_OP_BENCH=$dir/ssmk/ssmk-op-bench"
