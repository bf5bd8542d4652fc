#!/usr/bin/env bash
# Issue 12, Deliver 4: the engine vs mlx-lm on a lent CUDA GPU (MLX's CUDA backend, the nearest
# thing to Metal we can run), same weights, one process.
#
# The GPU machine has no network and takes at most 64 MiB per call, so the payload (the mlx and
# mlx-cuda-13 wheels, mlx-lm, gguf and the default model's GGUF, ~190 MB) travels as parts over
# several calls into /tmp/stage there (see RESULTS "Issue 12, round 4" for the recipe):
#
#   benchmarks/gpu_figures.sh stage DIR       # copy DIR/part.* into /tmp/stage (one call per part)
#   benchmarks/gpu_figures.sh run WEIGHTS...  # unpack, install into /tmp/site, run the benchmarks
#   benchmarks/gpu_figures.sh exec CMD...     # the same set-up, then any command (e.g. a cascade run)
#
# CUDA's own libraries come from the machine's PyTorch environment (nvidia-* cu13 packages), which
# libmlx.so finds through its RPATH ($ORIGIN/../../nvidia/...) via a symlink.
set -euo pipefail
STAGE=/tmp/stage
mkdir -p "$STAGE"

case "${1:-}" in
stage)
    cp "$2"/part.* "$STAGE"/
    ls -la "$STAGE"
    ;;
run | exec)
    mode=$1
    shift
    if [ ! -d /tmp/site/mlx ]; then
        cat "$STAGE"/part.* | tar -x -C "$STAGE"
        mkdir -p /tmp/site
        # unzip, not pip --target: mlx and mlx-cuda-13 both fill the package folder mlx/
        for w in "$STAGE"/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
        nv=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])')
        ln -sfn "$nv" /tmp/site/nvidia
    fi
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MLOTSPARK_HOME=/tmp/mlotspark-home
    export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    gguf=$(ls "$STAGE"/*.gguf | head -1)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device(), "cuda:", mx.cuda.is_available())'
    out=${OUT:-/tmp/out}
    mkdir -p "$out"
    if [ "$mode" = exec ]; then
        GGUF=$gguf "$@"
        exit
    fi
    for weights in "$@"; do
        echo "== weights $weights: engine vs mlx-lm (pp512, tg128, TTFT)"
        python3 benchmarks/engine_vs_mlx_lm.py --model "$gguf" --weights "$weights" -r 7 --ttft-reps 11 \
            --json "$out/engine_vs_mlx_lm.$weights.json" 2>&1 | tee "$out/engine_vs_mlx_lm.$weights.txt" | tail -40
        echo "== weights $weights: host ms/token vs compute"
        python3 benchmarks/decode_overhead.py --model "$gguf" --weights "$weights" --reps 7 --tokens 128 \
            2>&1 | tee "$out/decode_overhead.$weights.txt" | tail -12
    done
    ;;
*)
    echo "usage: $0 stage DIR | run WEIGHTS... | exec CMD..." >&2
    exit 2
    ;;
esac
