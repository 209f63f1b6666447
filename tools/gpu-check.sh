#!/usr/bin/env bash
# The one command that proves h5ddp's GPU path on a machine with NVIDIA GPUs (issue 21):
#   a. preflight: every piece a CUDA build and its tests need, each missing one named with its fix;
#   b. configure and build the CUDA configuration (H5DDP_WITH_CUDA=ON) into build-gpu;
#   c. run every ctest test labelled `gpu` there (NcclComm against MPI, tests/gpu: CUDA vs CPU training,
#      a checkpoint moved between GPU and CPU, bitwise resume after SIGKILL on CUDA, bf16 autocast).
# It ends with ONE summary line:
#   gpu-check: PASS 10/10 on 2x NVIDIA H200 (driver ..., CUDA 13.0, NCCL 2.28.9, LibTorch 2.8.0+cu128)
#   gpu-check: FAIL ...            (a build step or a test failed; exit 1)
#   gpu-check: CANNOT RUN: ...     (something is missing, named with the fix; exit 3)
#   gpu-check: INCOMPLETE: ...     (no failure, but tests were skipped, e.g. 2-rank tests on 1 GPU; exit 3)
# Status: written and checked on a machine WITHOUT a GPU only (where the preflight says CANNOT RUN); it has
# not yet run on GPU hardware.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

usage() {
  cat <<'EOF'
Usage: tools/gpu-check.sh [--bundle DIR] [--preflight-only] [--build-dir DIR] [--jobs N] [--skip-build] [-h]
Checks, builds (-DH5DDP_WITH_CUDA=ON) and runs `ctest -L gpu` on a machine with NVIDIA GPUs.
  --bundle DIR       a bare machine: take Open MPI, parallel HDF5, Boost, fmt, GoogleTest and Fashion-MNIST from
                     the Debian packages in DIR (tools/gpu-bundle.sh), unpacked into $TMPDIR/h5ddp-bundle (never
                     into /); the machine's own copies of libraries it already has win
  --out DIR          also write the summary line and the logs there (default: $OUT when set)
  --preflight-only   only check that everything needed is there (exit 0 if so, 3 if not)
  --build-dir DIR    build directory (default: $H5DDP_GPU_BUILD_DIR or build-gpu)
  --jobs N           parallel build jobs (default: nproc)
  --skip-build       run the tests in the build directory as it is (a rerun after a build)
  -h, --help         this text
Environment: Torch_DIR (a CUDA LibTorch's share/cmake/Torch; default: derived from a python3 whose torch has
CUDA), CUDAToolkit_ROOT (default: nvcc's, else /usr/local/cuda), NCCL_ROOT, H5DDP_TORCH_PYTHON (a python3 with
a CUDA torch to derive Torch_DIR from), CUDA_VISIBLE_DEVICES (honoured when counting GPUs).
Exit codes: 0 every gpu test ran and passed; 1 a build step or a test failed; 2 bad options;
3 cannot run (something missing) or incomplete (tests skipped for lack of GPUs).
EOF
}

build_dir=${H5DDP_GPU_BUILD_DIR:-build-gpu}
jobs=$(nproc 2>/dev/null || echo 2)
preflight_only=0
skip_build=0
bundle=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) [ $# -ge 2 ] || { echo "gpu-check: --bundle needs a directory" >&2; exit 2; }; bundle=$2; shift ;;
    --bundle=*) bundle=${1#*=} ;;
    --out) [ $# -ge 2 ] || { echo "gpu-check: --out needs a directory" >&2; exit 2; }; out_dir=$2; shift ;;
    --preflight-only) preflight_only=1 ;;
    --build-dir)
      [ $# -ge 2 ] || { echo "gpu-check: --build-dir needs a directory" >&2; exit 2; }
      build_dir=$2
      shift
      ;;
    --build-dir=*) build_dir=${1#*=} ;;
    --jobs | -j) [ $# -ge 2 ] || { echo "gpu-check: --jobs needs a number" >&2; exit 2; }; jobs=$2; shift ;;
    --jobs=*) jobs=${1#*=} ;;
    --skip-build) skip_build=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu-check: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$jobs" in '' | *[!0-9]* | 0) echo "gpu-check: --jobs needs a positive number, got '$jobs'" >&2; exit 2 ;; esac

missing=()
# The last line, also into $OUT/gpu-check-summary.txt with the logs beside it when OUT (or --out) names a folder:
# on a lent GPU machine, what comes back.
out_dir=${out_dir:-${OUT:-}}
finish() {
  local code=$1
  shift
  echo "$*"
  if [ -n "$out_dir" ]; then
    mkdir -p "$out_dir" && echo "$*" >"$out_dir/gpu-check-summary.txt"
    for f in "$build_dir"/gpu-check-*.log; do [ -f "$f" ] && cp "$f" "$out_dir/"; done
  fi
  exit "$code"
}
# Messages: the arguments joined by spaces (long ones are split over several lines).
ok() { echo "gpu-check:   ok       $*"; }
note() { echo "gpu-check:   note     $*"; }
miss() {
  missing+=("$*")
  echo "gpu-check:   MISSING  $*"
}

multiarch=$(gcc -print-multiarch 2>/dev/null || true)
[ -n "$multiarch" ] || multiarch="$(uname -m)-linux-gnu"
inc_dirs=(/usr/include /usr/local/include "/usr/include/$multiarch")
lib_dirs=("/usr/lib/$multiarch" "/lib/$multiarch" /usr/lib64 /usr/lib /usr/local/lib /usr/local/lib64)
H5DDP_BUNDLE_CMAKE_ARGS=()
if [ -n "$bundle" ]; then
  # shellcheck source=bundle-env.sh
  H5DDP_BUNDLE_SYSTEM_WINS=1 . tools/bundle-env.sh "$bundle" "${TMPDIR:-/tmp}/h5ddp-bundle" ||
    { echo "gpu-check: CANNOT RUN: the bundle $bundle could not be unpacked (see above)"; exit 3; }
  inc_dirs=("$H5DDP_BUNDLE_PREFIX/usr/include" "${inc_dirs[@]}")
  lib_dirs=("$H5DDP_BUNDLE_PREFIX/usr/lib/$multiarch" "${lib_dirs[@]}")
  [ -d "$H5DDP_BUNDLE_PREFIX/usr/share/datasets/fashion-mnist" ] &&
    export H5DDP_FASHION_MNIST=$H5DDP_BUNDLE_PREFIX/usr/share/datasets/fashion-mnist
fi
test_python=/usr/bin/python3
# first_file NAME DIR...: the first DIR/NAME that exists.
first_file() {
  local name=$1 d
  shift
  for d in "$@"; do
    [ -n "$d" ] && [ -e "$d/$name" ] && { echo "$d/$name"; return 0; }
  done
  return 1
}
# ver_ge A B: version A >= B (dotted numbers).
ver_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }

echo "gpu-check: preflight (source tree $(pwd), build directory $build_dir)"

# ---- 1. GPUs and the driver -------------------------------------------------------------------------------
gpus=0
gpu_name=""
driver=""
driver_cuda=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
  miss "a GPU: nvidia-smi not found, so no NVIDIA driver here (run on a GPU node; the driver provides nvidia-smi," \
       "e.g. apt-get install nvidia-driver)"
else
  smi_list=$(timeout 60 nvidia-smi -L 2>&1)
  smi_rc=$?
  gpus=$(printf '%s\n' "$smi_list" | grep -cE '^GPU [0-9]+:' || true)
  if [ "$smi_rc" -ne 0 ]; then
    miss "a working NVIDIA driver: nvidia-smi -L failed (exit $smi_rc): $(printf '%s' "$smi_list" | head -n 1)"
    gpus=0
  elif [ "$gpus" -eq 0 ]; then
    miss "a GPU: nvidia-smi -L lists none"
  else
    if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
      visible=0
      IFS=',' read -r -a cvd <<<"$CUDA_VISIBLE_DEVICES"
      for x in "${cvd[@]}"; do
        x=${x// /}
        [ -z "$x" ] || [ "$x" = "-1" ] && break  # CUDA stops at the first invalid entry
        visible=$((visible + 1))
      done
      [ "$visible" -lt "$gpus" ] && note "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES: $visible of $gpus GPUs visible"
      gpus=$((visible < gpus ? visible : gpus))
    fi
    gpu_name=$(timeout 60 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    driver=$(timeout 60 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    driver_cuda=$(timeout 60 nvidia-smi 2>/dev/null | grep -oE 'CUDA Version: *[0-9]+\.[0-9]+' | head -n 1 |
      grep -oE '[0-9]+\.[0-9]+')
    if [ "$gpus" -eq 0 ]; then
      miss "a visible GPU: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES hides every GPU nvidia-smi lists"
    else
      ok "$gpus GPU(s): ${gpu_name:-?} (driver ${driver:-?}, supports CUDA ${driver_cuda:-?})"
      [ "$gpus" -ge 2 ] || note "1 GPU: the 2-rank tests (*.np2) cannot run (NCCL refuses two ranks on one GPU); they" \
                                "will count as skipped"
    fi
  fi
fi

# ---- 2. CUDA toolkit (nvcc: a CUDA LibTorch's CMake config enables the CUDA language) ---------------------
cuda_root=${CUDAToolkit_ROOT:-}
cuda_from="CUDAToolkit_ROOT"
if [ -z "$cuda_root" ]; then
  if command -v nvcc >/dev/null 2>&1; then
    cuda_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    cuda_from="nvcc on PATH"
  elif [ -d /usr/local/cuda ]; then
    cuda_root=/usr/local/cuda
    cuda_from="/usr/local/cuda"
  fi
fi
cuda_version=""
if [ -z "$cuda_root" ]; then
  miss "the CUDA toolkit: no nvcc on PATH, no /usr/local/cuda (install NVIDIA's CUDA toolkit, e.g. apt-get install" \
       "cuda-toolkit-12-8 from NVIDIA's repository, or set CUDAToolkit_ROOT=<dir with bin/nvcc>)"
else
  cuda_inc=("$cuda_root/include" "$cuda_root/targets/$(uname -m)-linux/include" "${inc_dirs[@]}")
  cuda_lib=("$cuda_root/lib64" "$cuda_root/lib" "$cuda_root/targets/$(uname -m)-linux/lib" "$cuda_root/lib/$multiarch"
    "${lib_dirs[@]}")
  cuda_h=$(first_file cuda.h "${cuda_inc[@]}") || cuda_h=""
  if [ -n "$cuda_h" ]; then
    v=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$cuda_h" | head -n 1)
    [ -n "$v" ] && cuda_version="$((v / 1000)).$(((v % 1000) / 10))"
  fi
  if [ ! -x "$cuda_root/bin/nvcc" ]; then
    miss "nvcc: $cuda_root/bin/nvcc not found (from $cuda_from; a CUDA LibTorch's CMake config needs the CUDA" \
         "compiler: install the full CUDA toolkit or set CUDAToolkit_ROOT=<dir with bin/nvcc>)"
  elif ! first_file cuda_runtime_api.h "${cuda_inc[@]}" >/dev/null ||
    ! first_file libcudart.so "${cuda_lib[@]}" >/dev/null; then
    miss "the CUDA runtime: cuda_runtime_api.h or libcudart.so missing under $cuda_root (install the CUDA toolkit's" \
         "cudart development files, or set CUDAToolkit_ROOT)"
  else
    [ -n "$cuda_version" ] ||
      cuda_version=$("$cuda_root/bin/nvcc" --version 2>/dev/null | grep -oE 'release [0-9]+\.[0-9]+' |
        grep -oE '[0-9.]+$')
    ok "CUDA toolkit ${cuda_version:-?} at $cuda_root (from $cuda_from)"
  fi
  if [ -n "$cuda_version" ] && [ -n "$driver_cuda" ] && [ "${driver_cuda%%.*}" -lt "${cuda_version%%.*}" ]; then
    miss "a driver for CUDA $cuda_version: driver $driver supports CUDA $driver_cuda and cannot run code built with" \
         "the $cuda_version toolkit (upgrade the driver, >= 580 for CUDA 13, or set CUDAToolkit_ROOT to a CUDA" \
         "${driver_cuda%%.*}.x toolkit)"
  elif [ -n "$cuda_version" ] && [ -n "$driver_cuda" ] && ! ver_ge "$driver_cuda" "$cuda_version"; then
    note "driver supports CUDA $driver_cuda, the toolkit is $cuda_version (same major: minor-version compatibility" \
         "applies)"
  fi
fi

# ---- 3. NCCL ----------------------------------------------------------------------------------------------
nccl_root_arg=""
nccl_version=""
nccl_inc_dirs=()
nccl_lib_dirs=()
[ -n "${NCCL_ROOT:-}" ] && nccl_inc_dirs+=("$NCCL_ROOT/include") && nccl_lib_dirs+=("$NCCL_ROOT/lib" "$NCCL_ROOT/lib64")
[ -n "$cuda_root" ] && nccl_inc_dirs+=("${cuda_inc[@]}") && nccl_lib_dirs+=("${cuda_lib[@]}")
nccl_inc_dirs+=("${inc_dirs[@]}")
nccl_lib_dirs+=("${lib_dirs[@]}")
nccl_h=$(first_file nccl.h "${nccl_inc_dirs[@]}") || nccl_h=""
nccl_so=$(first_file libnccl.so "${nccl_lib_dirs[@]}") || nccl_so=""
if [ -z "$nccl_h" ] || [ -z "$nccl_so" ]; then
  miss "NCCL: ${nccl_h:-nccl.h not found}, ${nccl_so:-libnccl.so not found} (searched" \
       "${NCCL_ROOT:+NCCL_ROOT=$NCCL_ROOT, }${cuda_root:+$cuda_root, }the system; apt-get install libnccl-dev from" \
       "NVIDIA's CUDA repository, or set NCCL_ROOT=<dir with include/nccl.h and lib/libnccl.so> (a pip nvidia-nccl" \
       "has only libnccl.so.2: add the libnccl.so symlink))"
else
  nccl_version=$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v[$2]=$3}
    END{if (v["NCCL_MAJOR"] != "") print v["NCCL_MAJOR"] "." v["NCCL_MINOR"] "." v["NCCL_PATCH"]}' "$nccl_h")
  [ -n "${NCCL_ROOT:-}" ] && nccl_root_arg=$NCCL_ROOT
  ok "NCCL ${nccl_version:-?}: $nccl_h, $nccl_so"
fi

# ---- 4. Open MPI and parallel HDF5 ------------------------------------------------------------------------
if ! command -v mpirun >/dev/null 2>&1; then
  miss "Open MPI: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
else
  mpi_version=$(mpirun --version 2>&1 | head -n 1)
  if printf '%s' "$mpi_version" | grep -q "Open MPI"; then
    ok "$mpi_version"
  else
    miss "Open MPI: mpirun is '$mpi_version' (the tests use Open MPI's mpirun options: apt-get install openmpi-bin" \
         "libopenmpi-dev, first on PATH)"
  fi
fi
command -v mpicxx >/dev/null 2>&1 && ok "mpicxx: $(command -v mpicxx)" ||
  miss "mpicxx: not found (apt-get install libopenmpi-dev)"
if command -v h5pcc >/dev/null 2>&1 && h5pcc -showconfig 2>/dev/null | grep -qE 'Parallel HDF5: *yes'; then
  ok "parallel HDF5 (h5pcc -showconfig: Parallel HDF5: yes)"
elif h5h=$(first_file hdf5/openmpi/hdf5.h "${inc_dirs[@]}"); then
  ok "parallel HDF5 ($h5h)"
else
  miss "parallel HDF5: no h5pcc reporting 'Parallel HDF5: yes', no /usr/include/hdf5/openmpi/hdf5.h (apt-get install" \
       "libhdf5-openmpi-dev)"
fi

# ---- 5. a CUDA LibTorch -----------------------------------------------------------------------------------
torch_dir=${Torch_DIR:-}
torch_from="Torch_DIR"
torch_version=""
torch_cuda=""
torch_abi=""
seen=()
if [ -z "$torch_dir" ]; then
  tried=()
  for py in ${H5DDP_TORCH_PYTHON:-} python3 /usr/bin/python3 /usr/local/bin/python3 python; do
    p=$(command -v "$py" 2>/dev/null) || continue
    real=$(readlink -f "$p")
    case " ${seen[*]} " in *" $real "*) continue ;; esac
    seen+=("$real")
    out=$(timeout 120 "$p" -c 'import torch, torch.utils
print(torch.__version__)
print(torch.version.cuda)
print(torch.utils.cmake_prefix_path)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null) || { tried+=("$p: no torch"); continue; }
    v=$(sed -n 1p <<<"$out")
    c=$(sed -n 2p <<<"$out")
    if [ "$c" = "None" ]; then
      tried+=("$p: torch $v is CPU-only (torch.version.cuda is None)")
      continue
    fi
    if [ ! -f "$(sed -n 3p <<<"$out")/Torch/TorchConfig.cmake" ]; then
      tried+=("$p: torch $v+CUDA $c has no $(sed -n 3p <<<"$out")/Torch/TorchConfig.cmake")
      continue
    fi
    torch_dir="$(sed -n 3p <<<"$out")/Torch"
    torch_from="$p's torch (torch.utils.cmake_prefix_path)"
    torch_version=$v
    torch_cuda=$c
    torch_abi=$(sed -n 4p <<<"$out")
    break
  done
  if [ -z "$torch_dir" ]; then
    why=$(IFS=';'; echo "${tried[*]:-no python3 found}" | sed 's/;/; /g')
    deb=/usr/lib/$multiarch/cmake/Torch/TorchConfig.cmake
    if [ -f "$deb" ] && ! first_file libtorch_cuda.so "/usr/lib/$multiarch" >/dev/null; then
      why="Debian's LibTorch ($(dirname "$deb")) is CPU-only; $why"
    fi
    miss "a CUDA-enabled LibTorch: Torch_DIR is not set and none was found ($why): pip install a CUDA torch >= 2.7" \
         "into a python3 (then rerun, or set H5DDP_TORCH_PYTHON=that python3), or set" \
         "Torch_DIR=\$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch, or Torch_DIR=<LibTorch" \
         "zip, cxx11 ABI, CUDA>/share/cmake/Torch"
  fi
elif [ ! -f "$torch_dir/TorchConfig.cmake" ]; then
  miss "a CUDA-enabled LibTorch: Torch_DIR=$torch_dir has no TorchConfig.cmake (set" \
       "Torch_DIR=<libtorch>/share/cmake/Torch)"
  torch_dir=""
fi
if [ -n "$torch_dir" ]; then
  torch_top=$(readlink -f "$torch_dir/../../..")
  torch_libs=("$torch_top/lib" "$(readlink -f "$torch_dir/../..")")
  if [ -z "$torch_version" ]; then
    if [ -f "$torch_top/build-version" ]; then
      torch_version=$(head -n 1 "$torch_top/build-version")
    elif [ -f "$torch_dir/TorchConfigVersion.cmake" ]; then
      torch_version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")/\1/p' "$torch_dir/TorchConfigVersion.cmake" | head -n 1)
    fi
    case "$torch_version" in *+cu[0-9]*) c=${torch_version##*+cu}; torch_cuda="${c%?}.${c: -1}" ;; esac
  fi
  if [ -z "$torch_abi" ]; then
    if grep -q '_GLIBCXX_USE_CXX11_ABI=0' "$torch_dir/TorchConfig.cmake"; then torch_abi=0; else torch_abi=1; fi
  fi
  if ! first_file libtorch_cuda.so "${torch_libs[@]}" >/dev/null; then
    miss "a CUDA-enabled LibTorch: $torch_dir (from $torch_from, ${torch_version:-version ?}) is CPU-only, no" \
         "libtorch_cuda.so in ${torch_libs[*]} (set Torch_DIR to a CUDA LibTorch:" \
         "\$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch of a pip torch with CUDA)"
  elif [ "$torch_abi" = "0" ]; then
    miss "a LibTorch built with the C++11 ABI: $torch_dir (${torch_version:-?}) uses -D_GLIBCXX_USE_CXX11_ABI=0 and" \
         "Debian's Boost and fmt use the C++11 ABI (pip torch >= 2.7, or the cxx11-abi LibTorch zip)"
  else
    ok "LibTorch ${torch_version:-?} with CUDA ${torch_cuda:-?}: Torch_DIR=$torch_dir (from $torch_from)"
    if [ -n "$torch_cuda" ] && [ -n "$cuda_version" ] && [ "${torch_cuda%%.*}" != "${cuda_version%%.*}" ]; then
      note "LibTorch is built for CUDA $torch_cuda, the toolkit is $cuda_version: both CUDA runtimes load into" \
           "h5ddp-train; if the build or the tests fail at CUDA initialisation, set CUDAToolkit_ROOT to a CUDA" \
           "${torch_cuda%%.*}.x toolkit"
    fi
  fi
fi

# ---- 6. build tools and the libraries CMakeLists.txt requires ---------------------------------------------
if command -v cmake >/dev/null 2>&1; then
  cmake_version=$(cmake --version | head -n 1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?')
  if ver_ge "$cmake_version" 3.18; then ok "cmake $cmake_version"; else
    miss "cmake >= 3.18: found $cmake_version (apt-get install cmake from a newer release, or pip install cmake)"
  fi
  command -v ctest >/dev/null 2>&1 || miss "ctest: not found next to cmake (apt-get install cmake)"
else
  miss "cmake >= 3.18: not found (apt-get install cmake)"
fi
case "${CMAKE_GENERATOR:-}" in
  *Ninja*) command -v ninja >/dev/null 2>&1 && ok "ninja (CMAKE_GENERATOR=$CMAKE_GENERATOR)" ||
    miss "ninja: CMAKE_GENERATOR=$CMAKE_GENERATOR but no ninja (apt-get install ninja-build)" ;;
  *) command -v make >/dev/null 2>&1 && ok "make" || miss "make: not found (apt-get install make)" ;;
esac
cxx=${CXX:-c++}
cxx_tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-XXXXXX")
if ! command -v "$cxx" >/dev/null 2>&1; then
  miss "a C++17 compiler: $cxx not found (apt-get install g++)"
elif printf '#include <optional>\nint main() { std::optional<int> o{0}; if constexpr (true) return *o; }\n' |
  "$cxx" -std=c++17 -x c++ - -o "$cxx_tmp/a.out" >/dev/null 2>&1; then
  ok "C++17 compiler: $("$cxx" --version 2>/dev/null | head -n 1)"
else
  miss "a C++17 compiler: $cxx cannot compile C++17 (apt-get install g++)"
fi
rm -rf "$cxx_tmp"
# dev_check WHAT FIX HEADER [LIBRARY]: header (and library) in the system directories.
dev_check() {
  local what=$1 fix=$2 hdr=$3 lib=${4:-} h l
  h=$(first_file "$hdr" "${inc_dirs[@]}") || h=""
  l=""
  [ -z "$lib" ] || l=$(first_file "$lib" "${lib_dirs[@]}") || l=""
  if [ -z "$h" ] || { [ -n "$lib" ] && [ -z "$l" ]; }; then
    miss "$what: ${h:-$hdr not found}${lib:+, ${l:-$lib not found}} ($fix)"
    return 1
  fi
  ok "$what: $h${l:+, $l}"
}
if dev_check "Boost.Program_options" "apt-get install libboost-program-options-dev" boost/program_options.hpp \
  libboost_program_options.so; then
  bv_h=$(first_file boost/version.hpp "${inc_dirs[@]}") || bv_h=/dev/null
  bv=$(sed -n 's/^#define BOOST_VERSION \([0-9]*\).*/\1/p' "$bv_h")
  [ -z "$bv" ] || [ "$bv" -ge 107400 ] ||
    miss "Boost >= 1.74: found $((bv / 100000)).$((bv / 100 % 1000)) (apt-get install libboost-program-options-dev" \
         "from Debian 12 or newer)"
fi
dev_check "fmt" "apt-get install libfmt-dev" fmt/format.h libfmt.so
dev_check "zlib" "apt-get install zlib1g-dev" zlib.h libz.so
dev_check "xxHash headers" "apt-get install libxxhash-dev" xxhash.h
dev_check "GoogleTest" "apt-get install libgtest-dev" gtest/gtest.h libgtest.a

# ---- 7. what the gpu tests use at run time ----------------------------------------------------------------
for py in /usr/bin/python3 "$(command -v python3 2>/dev/null)"; do
  [ -n "$py" ] && "$py" -c 'import numpy, h5py, torch' >/dev/null 2>&1 && { test_python=$py; break; }
done
if "$test_python" -c 'import numpy, h5py, torch' >/dev/null 2>&1; then
  ok "$test_python with numpy, h5py, torch (the test drivers; torch.load of an exported checkpoint)"
else
  miss "/usr/bin/python3 with numpy, h5py and torch (the gpu tests run under it: apt-get install python3-numpy" \
       "python3-h5py python3-torch)"
fi
fm=${H5DDP_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ -f "$fm/train-images-idx3-ubyte.gz" ] && [ -f "$fm/train-labels-idx1-ubyte.gz" ] &&
  [ -f "$fm/t10k-images-idx3-ubyte.gz" ] && [ -f "$fm/t10k-labels-idx1-ubyte.gz" ]; then
  ok "Fashion-MNIST in $fm"
else
  miss "Fashion-MNIST: $fm/*-ubyte.gz (the gpu tests train on it: apt-get install dataset-fashion-mnist)"
fi

# ---- the facts for the summary line --------------------------------------------------------------------------
facts="driver ${driver:-?}, CUDA ${cuda_version:-?}, NCCL ${nccl_version:-?}, LibTorch ${torch_version:-?}"
case "$torch_version" in *+cu*) ;; *) [ -z "$torch_cuda" ] || facts="$facts (CUDA $torch_cuda)" ;; esac
where="${gpus}x ${gpu_name:-GPU}"

if [ ${#missing[@]} -gt 0 ]; then
  line=""
  for m in "${missing[@]}"; do line="${line:+$line; }missing $m"; done
  finish 3 "gpu-check: CANNOT RUN: $line"
fi
if [ "$preflight_only" -eq 1 ]; then
  echo "gpu-check: PREFLIGHT OK on $where ($facts): run tools/gpu-check.sh without --preflight-only to build and test"
  exit 0
fi

# ---- b. configure and build ---------------------------------------------------------------------------------
mkdir -p "$build_dir" || { echo "gpu-check: FAIL: cannot create $build_dir"; exit 1; }
if [ "$skip_build" -eq 0 ]; then
  cmake_args=(-S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DH5DDP_WITH_CUDA=ON "-DTorch_DIR=$torch_dir"
    -DH5DDP_BUILD_BENCHMARKS=OFF "-DCUDAToolkit_ROOT=$cuda_root" "-DH5DDP_TEST_PYTHON=$test_python"
    "${H5DDP_BUNDLE_CMAKE_ARGS[@]}")
  [ -z "$nccl_root_arg" ] || cmake_args+=("-DNCCL_ROOT=$nccl_root_arg")
  echo "gpu-check: configure: cmake ${cmake_args[*]}"
  if ! cmake "${cmake_args[@]}" >"$build_dir/gpu-check-configure.log" 2>&1; then
    tail -n 40 "$build_dir/gpu-check-configure.log"
    finish 1 "gpu-check: FAIL: cmake configure failed on $where ($facts); log: $build_dir/gpu-check-configure.log"
  fi
  echo "gpu-check: build: cmake --build $build_dir -j$jobs (log: $build_dir/gpu-check-build.log)"
  t0=$SECONDS
  if ! cmake --build "$build_dir" -j"$jobs" >"$build_dir/gpu-check-build.log" 2>&1; then
    grep -E 'error|Error' "$build_dir/gpu-check-build.log" | head -n 30
    tail -n 20 "$build_dir/gpu-check-build.log"
    finish 1 "gpu-check: FAIL: build failed on $where ($facts); log: $build_dir/gpu-check-build.log"
  fi
  echo "gpu-check: built in $((SECONDS - t0)) s"
  facts="$facts, built in $((SECONDS - t0)) s with -j$jobs"
elif [ ! -f "$build_dir/CTestTestfile.cmake" ]; then
  finish 1 "gpu-check: FAIL: --skip-build, but $build_dir is not a configured build directory"
fi

# ---- c. ctest -L gpu ---------------------------------------------------------------------------------------
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 HDF5_USE_FILE_LOCKING=FALSE
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
listed=$(cd "$build_dir" && ctest -N -L gpu 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: *\([^ ]*\).*/\1/p')
# NCCL runs one rank per GPU: a test at N ranks needs N GPUs (its name ends in .npN).
too_big=()
for t in $listed; do
  case "$t" in *.np[0-9]*) n=${t##*.np}; [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt "$gpus" ] && too_big+=("$t") ;; esac
done
exclude=()
if [ ${#too_big[@]} -gt 0 ]; then
  re=$(printf '^%s$|' "${too_big[@]}" | sed 's/\./\\./g; s/|$//')
  exclude=(-E "$re")
  echo "gpu-check: not run (need more GPUs than the $gpus visible): ${too_big[*]}"
fi
ctest_log="$build_dir/gpu-check-ctest.log"
echo "gpu-check: tests: (cd $build_dir && ctest -L gpu --output-on-failure --timeout 900 ${exclude[*]})"
(cd "$build_dir" && ctest -L gpu --output-on-failure --timeout 900 "${exclude[@]}") 2>&1 | tee "$ctest_log"
# "  3/10 Test #12: name .....   Passed    1.2 sec" (or ***Failed, ***Skipped, ***Timeout, ***Not Run, ***Exception)
results=$(sed -n 's/^ *[0-9]*\/[0-9]* *Test *#[0-9]*: *\([^ ]*\) \.*[ *]*\([A-Za-z]*\).*/\1 \2/p' "$ctest_log")
passed=() failed=() skipped=()
while read -r name status rest; do
  [ -n "$name" ] || continue
  case "$status" in
    Passed) passed+=("$name") ;;
    Skipped) skipped+=("$name") ;;
    *) failed+=("$name") ;;
  esac
done <<<"$results"
skipped+=("${too_big[@]}")
total=$((${#passed[@]} + ${#failed[@]} + ${#skipped[@]}))
if [ "$total" -eq 0 ]; then
  finish 1 "gpu-check: FAIL: no gpu-labelled test found in $build_dir (configured without -DH5DDP_WITH_CUDA=ON?)"
fi
# ---- d. the benchmark line (indicative: one run each, after the tests) -----------------------------------------
# h5ddp-train on CUDA (the default CNN, a global batch of 64 per GPU, real Fashion-MNIST batches, gradients over
# NCCL) against PyTorch DDP over NCCL through this machine's torch on the same CNN and batch (synthetic input:
# tools/bench/ddp_bench.py --device cuda); samples/s each. NCCL's bus bandwidth needs 2+ GPUs: at 1 GPU an
# allreduce moves nothing, so only the step is compared there.
bench_line=""
if [ ${#failed[@]} -eq 0 ] && [ "$gpus" -ge 1 ] && [ "${H5DDP_GPU_CHECK_BENCH:-1}" = 1 ]; then
  bnp=$((gpus >= 2 ? 2 : 1))
  brun="$build_dir/gpu-check-bench-run"
  rm -rf "$brun"
  h5_sps=$(timeout 300 mpirun -np "$bnp" "$build_dir/tools/h5ddp-train" --device cuda --model cnn \
    --batch-size $((64 * bnp)) --max-steps 400 --no-eval --no-final-checkpoint --log-every 400 --run-dir "$brun" \
    --data-dir "${H5DDP_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}" 2>&1 | tee "$build_dir/gpu-check-bench.log" |
    sed -n 's/.* \([0-9][0-9]*\) samples\/s.*/\1/p' | tail -n 1)
  py_ms=$(timeout 300 mpirun -np "$bnp" "$test_python" tools/bench/ddp_bench.py --device cuda --model cnn --batch 64 \
    --steps 400 --warmup 20 2>&1 | tee -a "$build_dir/gpu-check-bench.log" | sed -n 's/.* ddp_ms=\([0-9.]*\).*/\1/p')
  py_sps=""
  [ -n "$py_ms" ] && py_sps=$(awk -v ms="$py_ms" -v n="$bnp" 'BEGIN { printf "%.0f", 64 * n * 1000 / ms }')
  bench_line="bench at $bnp GPU(s), CNN, batch 64/GPU: h5ddp-train ${h5_sps:-?} samples/s (data included),"
  bench_line="$bench_line PyTorch DDP NCCL ${py_sps:-?} samples/s (synthetic input, step only)"
  echo "gpu-check: $bench_line"
  facts="$facts; $bench_line"
fi
if [ ${#failed[@]} -gt 0 ]; then
  finish 1 "gpu-check: FAIL ${#failed[@]}/$total failed (${failed[*]}), ${#passed[@]} passed, ${#skipped[@]} skipped" \
    "on $where ($facts); log: $ctest_log"
fi
if [ ${#skipped[@]} -gt 0 ]; then
  finish 3 "gpu-check: INCOMPLETE: ${#passed[@]}/$total passed, ${#skipped[@]} skipped (${skipped[*]};" \
    "a test at N ranks needs N GPUs) on $where ($facts)"
fi
finish 0 "gpu-check: PASS ${#passed[@]}/$total on $where ($facts)"
