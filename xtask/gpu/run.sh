#!/bin/bash
# The GPU checks of the CUDA backend, in one go, on a machine with an NVIDIA GPU (no Rust
# toolchain needed there). Built on a machine without a GPU by `cargo xtask gpu-bundle`,
# which puts this script, the binaries and the PyTorch scripts into one folder:
#
#     bash <bundle>/run.sh [REPORT]        (REPORT defaults to $OUT/gpu-report.txt or
#                                           <bundle>/gpu-report.txt)
#
# Sections: the device, the CUDA tests (every device kernel against the host result;
# casts and unscale bit-exact; the MLP trained under float16 autocast + GradScaler),
# the same under compute-sanitizer, the conformance vectors on CUDA tensors, the NCCL
# process group (one rank, and two when there are two GPUs), the main
# job on cuda (and on the host for its accuracy), and the benchmarks beside PyTorch's.
# Each section's status goes to the summary at the end of the report; the exit status
# is the number of failed sections. GPU_BUNDLE_TRAIN_STEPS sets the main job's steps
# (default 400); GPU_BUNDLE_SKIP, an extended regular expression, skips the sections
# whose names match it (reported as skipped).
set -u
B=$(cd "$(dirname "$0")" && pwd)
REPORT=${1:-${OUT:-$B}/gpu-report.txt}
STEPS=${GPU_BUNDLE_TRAIN_STEPS:-400}
W=$(mktemp -d)
: >"$REPORT"
SUMMARY=()
FAILED=0

for f in "$B"/bin/*.gz; do
    gunzip -c "$f" >"$W/$(basename "$f" .gz)" && chmod +x "$W/$(basename "$f" .gz)"
done

# cudarc opens libcublas.so / libnvrtc.so (or their .so.12); a CUDA 13 system has .so.13:
# link the newest of each under the unversioned name.
mkdir -p "$W/lib"
LIBDIRS=""
for l in cublas cublasLt nvrtc; do
    f=$(find /usr/local/cuda*/ /opt /usr/lib/x86_64-linux-gnu -name "lib$l.so.[0-9]*" -not -path '*/stubs/*' 2>/dev/null \
        | grep -v 'builtins\|alt' | sort -V | tail -1)
    if [ -n "$f" ]; then
        ln -sf "$f" "$W/lib/lib$l.so"
        LIBDIRS="$LIBDIRS:$(dirname "$f")"
    fi
done
# cuDNN: the system's, else the one PyTorch's wheels bring (site-packages/nvidia/...);
# libcudnn.so.9 loads its engine libraries from its own folder.
PYNV=$(python3 -c 'import site; print(" ".join(p + "/nvidia" for p in site.getsitepackages()))' 2>/dev/null)
f=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu $PYNV -name 'libcudnn.so.[0-9]*' 2>/dev/null | sort -V | tail -1)
if [ -n "$f" ]; then
    ln -sf "$f" "$W/lib/libcudnn.so"
    LIBDIRS="$LIBDIRS:$(dirname "$f")"
fi
# NCCL (the nccl sections): cudarc opens libnccl.so first. The system's libnccl.so.2, else
# the one PyTorch's pip wheels bring (nvidia-nccl-cu12, under site-packages/nvidia).
f=$(find /usr/local/cuda*/ /opt /usr/lib/x86_64-linux-gnu /usr/lib64 -name 'libnccl.so.[0-9]*' 2>/dev/null \
    | sort -V | tail -1)
if [ -z "$f" ]; then
    for d in $(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null) \
        $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
        f=$(find "$d" -name 'libnccl.so.[0-9]*' 2>/dev/null | sort -V | tail -1)
        [ -n "$f" ] && break
    done
fi
if [ -n "$f" ]; then
    ln -sf "$f" "$W/lib/libnccl.so"
    LIBDIRS="$LIBDIRS:$(dirname "$f")"
fi
export LD_LIBRARY_PATH="$W/lib$LIBDIRS:${LD_LIBRARY_PATH:-}"
export PATH="$PATH:/usr/local/cuda/bin"

section() {
    local name=$1 limit=$2
    shift 2
    if [ -n "${GPU_BUNDLE_SKIP:-}" ] && [[ $name =~ $GPU_BUNDLE_SKIP ]]; then
        SUMMARY+=("SKIPPED  $name (GPU_BUNDLE_SKIP)")
        echo "== $name: skipped (GPU_BUNDLE_SKIP)" | tee -a "$REPORT"
        return
    fi
    echo "== $name: $*" | tee -a "$REPORT"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$W/section.log" 2>&1
    local rc=$?
    cat "$W/section.log" >>"$REPORT"
    tail -n 25 "$W/section.log"
    local status=PASS
    [ $rc -ne 0 ] && status="FAIL (exit $rc)" && FAILED=$((FAILED + 1))
    SUMMARY+=("$status  $name ($((SECONDS - t0)) s)")
    echo "-- $status" | tee -a "$REPORT"
}

section device 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
echo "libraries: $(ls -l "$W/lib" | tail -n +2 | awk '{print $NF}' | tr '\n' ' ')" | tee -a "$REPORT"
section "cuda kernel tests" 300 "$W/kernels" cuda_device:: --test-threads=1
section "cuda training tests" 300 "$W/amp" cuda_train:: --test-threads=1
section "conformance vectors on cuda" 600 "$W/conformance" --device cuda
# NCCL: every collective, DDP and the sharded scaler through NCCL on one GPU; two ranks
# need two GPUs (one GPU per rank), else the section reports itself skipped.
section "nccl one rank" 300 "$W/nccl_ranks" --world 1
section "nccl two ranks" 300 "$W/nccl_ranks" --world 2
section "main job on cuda" 900 "$W/train" --device cuda --steps "$STEPS" --out "$W/train-cuda"
section "main job on the host (its accuracy)" 900 "$W/train" --steps "$STEPS" --out "$W/train-cpu"
section "kernel benchmark (ours)" 300 "$W/cuda_bench"
section "kernel benchmark (PyTorch)" 300 python3 "$B/cuda_bench_torch.py"
section "training step benchmark (ours)" 300 "$W/gpu_step_bench"
section "training step benchmark (PyTorch)" 300 python3 "$B/gpu_step_bench_torch.py"
# Where a step's time goes: every kernel of one MLP step (float32, then AMP), of one
# conv step, and of one GPT step (the main job's model; float32, then AMP), a CSV line
# each with its duration (Nsight Compute, one pass per kernel; the program marks each
# step with cuProfilerStart/Stop; timings printed under it are not figures).
if command -v ncu >/dev/null; then
    section "kernels of one training step (ncu)" 300 ncu --profile-from-start off --csv \
        --metrics gpu__time_duration.sum "$W/gpu_step_bench" mlp conv
    section "kernels of one GPT step (ncu)" 300 ncu --profile-from-start off --csv \
        --metrics gpu__time_duration.sum "$W/gpu_step_bench" gpt
else
    SUMMARY+=("SKIPPED  kernels of one training step and one GPT step (ncu not found)")
fi

# Last: the slowest sections (every kernel under memcheck).
section "kernel tests under compute-sanitizer" 600 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$W/kernels" cuda_device:: --test-threads=1
section "training tests under compute-sanitizer" 600 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$W/amp" cuda_train:: --test-threads=1

{
    echo
    echo "== summary"
    printf '%s\n' "${SUMMARY[@]}"
    echo "== figures"
    # (not the timings printed under the profiler)
    awk '/^== /{ncu = ($0 ~ /^== kernels of one (training|GPT) step/)} !ncu' "$REPORT" |
        grep -h -E '^(torch_)?cuda_[a-z0-9_]+ [0-9.]+ ' | sort -u
} | tee -a "$REPORT"
rm -rf "$W"
exit $FAILED
