#!/usr/bin/env bash
# Every GPU check of this project in one call, for a lent GPU host that has its own torch and no package index
# (the device tool: docs/development.md). Prefect and the other packages the host lacks travel as wheels in .whl/.
# Each step's output goes to $OUT (or ./gpu-results), so what finished comes back even if a later step runs out of
# time. The bench scripts print ratios measured side by side in this one run.
#
#   bash bench/on_gpu.sh smoke                           # the GPU tests, trainings included (under 5 minutes)
#   bash bench/on_gpu.sh bench_gpu bench_score bench_score_again   # the figures of BENCHMARKS.md
#   bash bench/on_gpu.sh serve precision                 # issue 62: the endpoint on the GPU; bf16 and int8 figures
#   bash bench/on_gpu.sh                                 # every step below, in this order
# bench_gpu compares with the copy of the code in .baseline/ when there is one (made here, carried with the call):
#   mkdir .baseline && git archive HEAD tasks flows bench deployments pyproject.toml | tar -x -C .baseline
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site:.
else
    export PYTHONPATH=.
fi
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import sys, torch, torchvision; print('python', sys.version.split()[0], 'torch', torch.__version__, 'torchvision', torchvision.__version__, 'cudnn', torch.backends.cudnn.version()); print('cpus', __import__('os').cpu_count())"
} 2>&1 | tee "$OUT/env.txt"

step() {  # step NAME SECONDS COMMAND...: run with a time limit, output to $OUT/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s): $*"
    local started=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    echo "== $name: exit $? after $((SECONDS - started)) s"
    tail -n 15 "$OUT/$name.txt"
}

for name in "${@:-smoke bench_gpu bench_score bench_score_again stages bench_score_digits serve precision}"; do
    for name in $name; do
        case $name in
        smoke) step smoke 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/vision/test_device_pipeline.py -s ;;
        bench_gpu) step bench_gpu 280 python3 -m bench.gpu $([ -d .baseline ] && echo --baseline .baseline) ;;
        stages) step stages 90 python3 -m bench.device_stages ;;
        bench_score | bench_score_again) step $name 75 python3 -m bench.score --image-size 224 --limit-at-224 0 \
            --repetitions 2 --runtime torch --jpegs 1024 ;;
        bench_score_digits) step bench_score_digits 90 python3 -m bench.score --image-size 224 --limit-at-224 0 --repetitions 3 ;;
        # Ours, plain and LitServe, each with its model on the GPU (JPEGs decoded there), at concurrency 32: batches
        # of up to 32 fill. LitServe travels in .whl/ (bench/gpu_wheels.sh); without it, ours and plain.
        serve) step serve 240 python3 -m bench.serve --device cuda --concurrency 32 --seconds 12 --max-batch-size 32 \
            --no-swap --output "$OUT/serve.json" ;;
        # bf16 against fp32 scoring on the GPU; then int8 against fp32 on this host's CPU (ONNX Runtime; its cores
        # may have VNNI or AMX, which this project's 2-core VM lacks).
        precision)
            step bench_score_bf16 90 python3 -m bench.score --image-size 224 --limit-at-224 0 --repetitions 2 \
                --runtime torch --jpegs 1024 --precision fp32 --precision bf16
            step inference_int8 240 python3 -m bench.inference --skip-top1 --seconds 3 --repetitions 2
            ;;
        *) echo "unknown step $name" && exit 2 ;;
        esac
    done
done
