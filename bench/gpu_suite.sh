#!/usr/bin/env bash
# Every GPU figure of docs/benchmarks.md in one run, each bench's JSON written to one folder.
#
#   bash bench/gpu_suite.sh --device cuda --out "$OUT"     # H100/H200: 3B RM + SD3.5-M presets, bf16
#   bash bench/gpu_suite.sh --device cpu --out /tmp/suite  # CI: tiny presets, reduced sizes
#   ... --benches rm_throughput,rl_reward_overhead         # only these (default: all four)
#
# On the lent GPU machine, first `source .gpu/env.sh` (packed here by bench/pack_gpu_kit.sh). Each
# bench runs under its own time limit, so that the whole suite ends within 6 minutes; a bench that
# fails or runs out of time is reported and the suite goes on. The exit code is the number of benches that failed.
set -uo pipefail

device=cuda
out=${OUT:-outputs/bench/gpu_suite}
python=${PYTHON:-python3}
benches=rm_throughput,rl_reward_overhead,annotate_throughput,grpo_step
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --benches) benches=$2; shift 2 ;;
    *) echo "gpu_suite: unknown argument $1 (expected --device cuda|cpu, --out DIR, --benches A,B)" >&2; exit 2 ;;
  esac
done
case "$device" in cuda*|cpu) ;; *) echo "gpu_suite: --device must be cuda or cpu, got $device" >&2; exit 2 ;; esac
for name in ${benches//,/ }; do
  case "$name" in rm_throughput|rl_reward_overhead|annotate_throughput|grpo_step) ;;
    *) echo "gpu_suite: unknown bench $name (expected rm_throughput, rl_reward_overhead, annotate_throughput, grpo_step)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
export MUJOCO_GL=${MUJOCO_GL:-egl} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

if [ "$device" = cpu ]; then
  rm_args="--preset tiny --device cpu --batch-size 2 --num-frames 4 --warmup 1 --repeats 2 --threads 1"
  rl_args="--preset tiny --device cpu --num-envs 1,2 --steps 6 --repeats 1 --threads 1"
  annotate_args="--preset tiny --device cpu --num-videos 4 --frames 8 --batch-size 2 --max-frames 8 --workers 1 --repeats 1 --threads 1"
  grpo_args="--preset tiny --device cpu --batch-size 4 --group-size 2 --num-steps 3 --batches 2 --repeats 1 --threads 1"
  limits=(300 300 300 300)
else
  rm_args="--preset qwen2_5_vl_3b --device $device --dtype bfloat16"
  rl_args="--preset qwen2_5_vl_3b --device $device --dtype bfloat16 --steps 30 --repeats 2"
  annotate_args="--preset qwen2_5_vl_3b --device $device --dtype bfloat16 --workers 4 --num-videos 64 --repeats 1"
  grpo_args="--preset sd3_5_medium --device $device --dtype bfloat16 --batch-size 8 --group-size 4 --num-steps 10 --window-size 2 --repeats 2"
  limits=(100 80 75 70)  # seconds: rm_throughput, rl_reward_overhead, annotate_throughput, grpo_step
fi

failed=0 ran=0
say() { echo "$*" | tee -a "$out/suite.log"; }
run_bench() {  # name, time limit (s), script, arguments...
  local name=$1 limit=$2 script=$3; shift 3
  [[ ",$benches," == *",$name,"* ]] || return 0
  ran=$((ran + 1))
  local start=$SECONDS
  say "== $name: $script $*"
  timeout --kill-after 10 "$limit" "$python" "bench/$script" "$@" --output "$out/$name.json" 2>&1 | tee -a "$out/suite.log"
  local rc=${PIPESTATUS[0]}
  say "== $name: exit $rc after $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

[ "$device" = cpu ] || nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
# shellcheck disable=SC2086  # the argument strings are word lists on purpose
{
  run_bench rm_throughput "${limits[0]}" rm_throughput.py $rm_args
  run_bench rl_reward_overhead "${limits[1]}" rl_reward_overhead.py $rl_args
  run_bench annotate_throughput "${limits[2]}" annotate_throughput.py $annotate_args
  run_bench grpo_step "${limits[3]}" grpo_step.py $grpo_args
}
say "gpu_suite: $failed of $ran benches failed; results in $out"
exit "$failed"
