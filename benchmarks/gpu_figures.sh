#!/usr/bin/env bash
# Figures on a lent CUDA GPU (MLX's CUDA backend, the nearest thing to Metal we can run):
# the engine vs mlx-lm on the same weights, and RULER through the engine past 16k tokens.
#
# The GPU machine has no network and takes at most 64 MiB per call (the working tree included),
# so the payload travels in parts over several calls into /tmp/stage there, each call within
# the machine's 30 s warm window (RESULTS "Next lease" has the recipe):
#
#   benchmarks/gpu_figures.sh pack OUT FILE...  # here: each FILE as folders OUT/<name>.00/, .01/, ...
#   benchmarks/gpu_figures.sh stage DIR         # there: copy DIR's parts into /tmp/stage (one call each)
#   benchmarks/gpu_figures.sh join              # there: join the files whose parts are all staged
#   benchmarks/gpu_figures.sh run WEIGHTS...    # join, install into /tmp/site, run engine vs mlx-lm
#   benchmarks/gpu_figures.sh exec CMD...       # the same set-up, then any command (e.g. ruler.py)
#
# A file is joined once all its parts are there and their sha256 matches the one `pack` wrote;
# a joined .tar is unpacked, and the wheels in it (mlx, mlx-cuda-13, mlx-lm, gguf) installed.
# `run` and `exec` see the joined files' paths as STAGE_<NAME> (e.g. STAGE_QWEN_GGUF for
# qwen.gguf) and the first GGUF as GGUF.
# CUDA's own libraries come from the machine's PyTorch environment (nvidia-* cu13 packages), which
# libmlx.so finds through its RPATH ($ORIGIN/../../nvidia/...) via a symlink.
set -euo pipefail
STAGE=${STAGE:-/tmp/stage}

join_parts() {
    local sums name want
    for sums in "$STAGE"/*.sha256; do
        [ -e "$sums" ] || continue
        name=$(basename "$sums" .sha256)
        [ -e "$STAGE/$name" ] && continue
        want=$(cut -d' ' -f1 "$sums")
        if [ "$(cat "$STAGE/$name".part.* 2>/dev/null | sha256sum | cut -d' ' -f1)" != "$want" ]; then
            echo "gpu_figures: $name: parts missing or damaged ($(ls "$STAGE/$name".part.* 2>/dev/null | wc -l) here)" >&2
            continue
        fi
        cat "$STAGE/$name".part.* >"$STAGE/$name.tmp" || return 1 # a full disk must not cost the parts
        mv "$STAGE/$name.tmp" "$STAGE/$name"
        rm -f "$STAGE/$name".part.*
        case $name in *.tar) tar -x -C "$STAGE" -f "$STAGE/$name" ;; esac
        echo "gpu_figures: joined $name" >&2
    done
}

case "${1:-}" in
pack)
    out=$2
    shift 2
    mkdir -p "$out"
    for f in "$@"; do
        name=$(basename "$f")
        [ -s "$f" ] || { echo "gpu_figures: nothing to pack in $f (missing or empty)" >&2; exit 2; }
        # Parts as even as they come, each small enough that it and the working tree that
        # travels with it (tracked and untracked-not-ignored files: 5.7 MB on 2026-11-27, when
        # 61.4 MB parts no longer fit) stay under a call's 64 MiB, 1 MB spare.
        # (PART_BYTES: smaller parts, for the test.)
        # (|| true: a tracked file deleted from the tree must not stop the count under pipefail)
        tree=$(git -C "$(dirname "$0")/.." ls-files -z -co --exclude-standard | (cd "$(dirname "$0")/.." && xargs -0 stat -c %s -- 2>/dev/null || true) | awk '{s += $1} END {print s + 0}')
        most=${PART_BYTES:-$((67108864 - tree - 1000000))}
        [ "$most" -gt 0 ] || { echo "gpu_figures: the working tree ($tree bytes) leaves no room in a call's 64 MiB" >&2; exit 2; }
        sha256sum "$f" | sed "s|  .*|  $name|" >"$out/$name.sha256"
        size=$(stat -c %s "$f")
        n=$(((size + most - 1) / most))
        split -b $(((size + n - 1) / n)) -d -a 2 "$f" "$out/$name.part."
        for p in "$out/$name".part.*; do
            mkdir -p "$out/$name.${p##*.}"
            mv "$p" "$out/$name.${p##*.}/"
        done
        mv "$out/$name.sha256" "$out/$name.00/"
    done
    ls -la "$out"
    ;;
stage)
    mkdir -p "$STAGE"
    cp "$2"/* "$STAGE"/
    ls -la "$STAGE"
    ;;
join)
    mkdir -p "$STAGE"
    join_parts
    ;;
run | exec)
    mode=$1
    shift
    mkdir -p "$STAGE"
    join_parts
    if [ ! -d /tmp/site/mlx ]; then
        mkdir -p /tmp/site
        # unzip, not pip --target: mlx and mlx-cuda-13 both fill the package folder mlx/
        for w in "$STAGE"/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
        nv=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])')
        ln -sfn "$nv" /tmp/site/nvidia
    fi
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MLOTSPARK_HOME=/tmp/mlotspark-home
    export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    for f in "$STAGE"/*; do
        case $f in *.part.* | *.sha256 | *.whl | *.tar | *.tmp) continue ;; esac
        [ -f "$f" ] || continue
        var=STAGE_$(basename "$f" | tr 'a-z' 'A-Z' | tr -c 'A-Z0-9\n' '_')
        export "$var=$f"
    done
    for sums in "$STAGE"/*.sha256; do # a file still in parts: say so, do not run without it
        [ -e "$sums" ] && [ ! -e "${sums%.sha256}" ] && { echo "gpu_figures: $(basename "${sums%.sha256}") not joined" >&2; exit 1; }
    done
    GGUF=$(ls "$STAGE"/*.gguf 2>/dev/null | head -1 || true)
    export GGUF
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device(), "cuda:", mx.cuda.is_available())'
    out=${OUT:-/tmp/out}
    mkdir -p "$out"
    if [ "$mode" = exec ]; then
        "$@"
        exit
    fi
    for weights in "$@"; do
        echo "== weights $weights: engine vs mlx-lm (pp512, tg128; TTFT with more repetitions: short and noisy)"
        python3 -m mlotspark bench --model "$GGUF" --weights "$weights" --suite pp,tg --compare mlx-lm -r 7 \
            --progress off --format json --output "$out/bench_pp_tg.$weights.json" 2>&1 | tail -20
        python3 -m mlotspark bench --model "$GGUF" --weights "$weights" --suite ttft:cold --compare mlx-lm -r 11 \
            --progress off --format json --output "$out/bench_ttft.$weights.json" 2>&1 | tail -20
        echo "== weights $weights: host ms/token vs compute"
        python3 benchmarks/decode_overhead.py --model "$GGUF" --weights "$weights" --reps 7 --tokens 128 \
            2>&1 | tee "$out/decode_overhead.$weights.txt" | tail -12
    done
    ;;
*)
    echo "usage: $0 pack OUT FILE... | stage DIR | join | run WEIGHTS... | exec CMD..." >&2
    exit 2
    ;;
esac
