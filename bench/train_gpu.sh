#!/usr/bin/env bash
# GPU training throughput: tokens/s and MFU of `tokenmill train` at 125m and 1b in bf16.
#
#   bench/train_gpu.sh                 # every visible GPU (torchrun), presets 125m and 1b
#   PRESETS="1b" NPROC=1 STEPS=60 bench/train_gpu.sh
#
# Needs a Python with tokenmill and a CUDA build of torch (PYTHON=..., else .venv/bin/python,
# else python3); no network. Data: synthetic EOS-terminated documents written with the
# pipeline's own shard writer (bench/loader.py build), vocab $VOCAB: throughput does not
# depend on what the tokens say, and the bench then runs on any machine. Checkpoints, eval
# and export are off; the first $SKIP steps (CUDA init, torch.compile) are left out of the
# medians. MFU is tokenmill's own: (6N + 12*L*H*Q*T) * tokens/s against the dense bf16 peak
# of the GPU (trainer/metrics.py PEAK_FLOPS).
#
# Output: one line per preset, and $OUT/train_gpu.json (OUT defaults to the work folder).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
PRESETS=${PRESETS:-"125m 1b"}
STEPS=${STEPS:-40}
SKIP=${SKIP:-15}
SEQ=${SEQ:-2048}
VOCAB=${VOCAB:-32000}
COMPILE=${COMPILE:-true}
# Reused between runs (the shards): a private folder, never a fixed name in the shared /tmp.
WORK=${WORK:-$("$PYTHON" -c 'from tokenmill.private import cache_dir_or_temp; print(cache_dir_or_temp("bench", "gpu"))')}
OUT=${OUT:-$WORK}
mkdir -p "$WORK" "$OUT"

# ALLOW_CPU=1 (with e.g. PRESETS=tiny SEQ=64 COMPILE=false) checks this script without a GPU.
ALLOW_CPU=${ALLOW_CPU:-0} "$PYTHON" - <<'EOF'
import os, sys, torch
if not torch.cuda.is_available() and os.environ.get("ALLOW_CPU") != "1":
    sys.exit(f"train_gpu.sh: no CUDA device (torch {torch.__version__}); run it on a GPU machine")
if torch.cuda.is_available():
    print(f"torch {torch.__version__}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
EOF
NPROC=${NPROC:-$("$PYTHON" -c "import torch; print(max(1, torch.cuda.device_count()))")}

# Micro batch per GPU at seq 2048 without activation checkpointing, sized for an H100/H200-class GPU
# (1b at 8 needs ~70 GB: on 40-80 GB cards use MB_1B=4; an OOM is one line naming what to lower).
micro_batch() {
  case "$1" in
    125m) echo "${MB_125M:-16}" ;;
    350m) echo "${MB_350M:-12}" ;;
    1b) echo "${MB_1B:-8}" ;;
    *) echo 4 ;;
  esac
}

DATA="$WORK/data-v$VOCAB"
if [[ ! -f "$DATA/manifest.json" ]]; then
  echo "building synthetic shards in $DATA"
  "$PYTHON" -c "import sys; sys.path.insert(0, 'bench'); from loader import build; build('$DATA', 50_000_000, 4, vocab=$VOCAB)"
fi

for preset in $PRESETS; do
  run="$WORK/run-$preset"
  rm -rf "$run"
  mb=$(micro_batch "$preset")
  echo "== $preset: $NPROC GPU(s), micro batch $mb x seq $SEQ, bf16, compile=$COMPILE, $STEPS steps"
  # "--" is harmless: tokenmill's --run-dir is not torchrun's (its --run-path took --run).
  status=0
  OMP_NUM_THREADS=4 "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" --no-python -- \
    "$PYTHON" -m tokenmill.cli train --data "$DATA" --run-dir "$run" \
      --set model.preset="$preset" --set precision=bf16 --set data.seq_len="$SEQ" \
      --set train.micro_batch="$mb" --set train.grad_accum=1 --set train.steps="$STEPS" \
      --set train.log_every=5 --set optim.warmup_steps=5 --set parallel.compile="$COMPILE" \
      --set data.num_workers=4 --set data.verify_checksums=false \
      --set checkpoint.every=0 --set checkpoint.every_minutes=0 --set eval.every=0 \
      --set export.enabled=false --set metrics.tensorboard=false \
      || status=$?
  if [[ $status -ne 0 ]]; then
    echo "$preset: tokenmill train exited with $status (see above)"
    echo "{\"preset\": \"$preset\", \"error\": $status}" > "$run.error.json"
  fi
done

"$PYTHON" - "$WORK" "$OUT" "$SKIP" "$NPROC" $PRESETS <<'EOF'
import json, os, statistics, sys
work, out, skip, nproc, presets = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
results = []
for preset in presets:
    path = os.path.join(work, f"run-{preset}", "metrics.jsonl")
    if not os.path.exists(path):
        results.append({"preset": preset, "error": "no metrics (the run failed)"})
        continue
    rows = [json.loads(line) for line in open(path)][skip:]
    if not rows:
        results.append({"preset": preset, "error": "fewer steps than SKIP"})
        continue
    tps = statistics.median(r["tokens_per_s"] for r in rows)
    mfu = [r["mfu"] for r in rows if r.get("mfu") is not None]
    results.append({"preset": preset, "gpus": nproc, "steps_measured": len(rows), "tokens_per_s": tps,
                    "tokens_per_s_per_gpu": tps / nproc, "mfu": statistics.median(mfu) if mfu else None,
                    "peak_mem_gib": max(r["peak_mem_mb"] for r in rows) / 1024,
                    "data_wait_pct": statistics.median(r["data_wait_pct"] for r in rows),
                    "loss_last": rows[-1]["loss"]})
with open(os.path.join(out, "train_gpu.json"), "w") as fh:
    json.dump(results, fh, indent=2)
print()
for r in results:
    if "error" in r:
        print(f"{r['preset']:>5}: {r['error']}")
    else:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a (GPU not in PEAK_FLOPS)"
        print(f"{r['preset']:>5}: {r['tokens_per_s']:,.0f} tokens/s ({r['tokens_per_s_per_gpu']:,.0f}/GPU)  MFU {mfu}  "
              f"peak mem {r['peak_mem_gib']:.1f} GiB  data-wait {r['data_wait_pct']:.1f}%")
print(f"-> {os.path.join(out, 'train_gpu.json')}")
EOF
