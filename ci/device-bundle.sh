#!/usr/bin/env bash
# Prebuilt CUDA binaries for a GPU machine that cannot build memtrade itself: the lent H200s
# (see ci/gpu-check.sh) have nvcc, CMake and PyTorch but none of our C++ dependencies (fmt,
# nlohmann-json, CLI11, toml++, GoogleTest, Google Benchmark) and nothing can be installed there.
#
#   ci/device-bundle.sh [OUT_DIR]        (default: device-bundle)
#
# Builds memtrade, memtrade_gpu_tests and bench_cuda for sm_90 only (H100/H200: half the
# fatbin of the default 80+90) without OpenBLAS (the CPU reference of the GPU tests then uses
# the blocked GEMM; the 36 MiB library would not fit a 64 MiB carry), and collects:
#   OUT_DIR/bin/   the three executables
#   OUT_DIR/lib/   the shared libraries they need that a CUDA image may not have (toml++,
#                  sqlite, Google Benchmark, libgomp): everything ldd resolves outside glibc,
#                  libstdc++/libgcc_s and CUDA's own libraries
#   OUT_DIR/env.sh sourced by ci/gpu-check.sh: LD_LIBRARY_PATH = lib/, the CUDA toolkit's and
#                  the pip nvidia-* packages' library folders (cuDNN, cuBLAS) where they exist
# Carry OUT_DIR to the device and run `ci/gpu-check.sh OUT_DIR` there. Exit 0, or 1 when a
# target fails to build or the bundle exceeds 60 MiB.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/device-bundle}
BUILD=${BUNDLE_BUILD:-$ROOT/build-bundle}
JOBS=${JOBS:-$(nproc)}

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMEMTRADE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_DISABLE_FIND_PACKAGE_OpenBLAS=ON >"$BUILD.configure.log"
cmake --build "$BUILD" -j "$JOBS" --target memtrade memtrade_gpu_tests bench_cuda

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
cp "$BUILD/memtrade" "$BUILD/tests/memtrade_gpu_tests" "$BUILD/bench/bench_cuda" "$OUT/bin/"
strip --strip-unneeded "$OUT"/bin/* 2>/dev/null || true

# Libraries to carry: not glibc's, not libstdc++/libgcc_s (the image's are newer), not CUDA's
# (the image has the toolkit and PyTorch's nvidia-* wheels).
system='^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux.*)\.so'
cuda='^(libcudart|libcublas|libcublasLt|libcudnn.*|libnvToolsExt|libnvrtc)\.so'
for exe in "$OUT"/bin/*; do
  ldd "$exe" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  if [[ $name =~ $system || $name =~ $cuda ]]; then continue; fi
  cp -L "$path" "$OUT/lib/$name"
done

cat >"$OUT/env.sh" <<'EOF'
# Sourced by ci/gpu-check.sh: where the bundle's executables find their shared libraries.
bundle_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bundle_path=$bundle_dir/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $d ]] && bundle_path=$bundle_path:$d
done
# PyTorch's wheels (nvidia-cudnn-cu13, nvidia-cublas, ...) carry cuDNN and cuBLAS.
nvidia_libs=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
print(":".join(sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "*", "lib", "*.so*"))})))
PY
)
[[ -n $nvidia_libs ]] && bundle_path=$bundle_path:$nvidia_libs
export LD_LIBRARY_PATH=$bundle_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset bundle_dir bundle_path nvidia_libs
EOF

size=$(du -sm "$OUT" | cut -f1)
echo "device bundle: $OUT (${size} MiB)"
ls -la "$OUT/bin" "$OUT/lib"
if [[ $size -gt 60 ]]; then
  echo "device bundle exceeds 60 MiB: the device tool carries 64 MiB in all" >&2
  exit 1
fi
