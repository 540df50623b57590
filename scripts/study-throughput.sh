#!/usr/bin/env bash
# Training throughput of the CPU study's model in float32 and in bfloat16, measured in the layout the
# study trains in (JOBS trainings side by side, one thread each), the two precisions in turn, ROUNDS
# times, so that machine noise hits both alike. Prints updates/s per training for each round and the
# ratio of the medians (bfloat16 / float32). Stop the study's trainings first: anything beside them
# is measured slower and slows them.
#
#   bash scripts/study-throughput.sh [DATA_BIN]     # default: runs/data/paper/bible_de_en_full/bin
#   UPDATES=125 ROUNDS=2 JOBS=2 SETTING=cpu_faithful bash scripts/study-throughput.sh
#
# The command is the study's training command (configs/papers/study.yaml, setting SETTING, default
# cpu_faithful: read from there, so it cannot drift) with --max-update UPDATES --no-save
# --disable-validation; the first 25-update interval of each training (start-up) is left out of its mean.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-runs/data/paper/bible_de_en_full/bin}
UPDATES=${UPDATES:-125}
ROUNDS=${ROUNDS:-2}
JOBS=${JOBS:-2}
PYTHON=${PYTHON:-python}
[ -f "$DATA/dict.en.txt" ] || { echo "study-throughput.sh: no prepared data in $DATA (run the study's prepare step first)" >&2; exit 2; }
SETTING=${SETTING:-cpu_faithful}
mapfile -d '' STUDY_TRAIN < <("$PYTHON" -c 'import shlex, sys, yaml
settings = yaml.safe_load(open("fairseq_sparse/configs/papers/study.yaml"))["settings"]
train = settings.get(sys.argv[1], {}).get("train", "")
sys.stdout.write("".join(word + "\0" for word in shlex.split(train)))' "$SETTING")
[ ${#STUDY_TRAIN[@]} -gt 0 ] || { echo "study-throughput.sh: no training options for setting $SETTING in configs/papers/study.yaml" >&2; exit 2; }
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT

train_pair() {  # $1: tag; the rest: extra options
  local tag=$1; shift
  for job in $(seq 1 "$JOBS"); do
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$PYTHON" -m fairseq_sparse.train "$DATA" --user-dir fairseq_sparse \
      "${STUDY_TRAIN[@]}" --log-interval 25 --seed "$job" \
      --max-update "$UPDATES" --no-save --disable-validation "$@" > "$LOGS/$tag.$job.log" 2>&1 &
  done
  wait
  for job in $(seq 1 "$JOBS"); do
    grep -oE 'ups=[0-9.]+' "$LOGS/$tag.$job.log" | tail -n +2 | cut -d= -f2 |
      awk -v t="$tag" -v j="$job" '{s += $1; n++} END {if (!n) {print t ": no progress lines" > "/dev/stderr"; exit 1}
                                    printf "%s job %d: %.3f updates/s\n", t, j, s / n}'
  done
}

for round in $(seq 1 "$ROUNDS"); do
  train_pair "float32 round $round"
  train_pair "bfloat16 round $round" --bf16 --memory-efficient-bf16
done | tee "$LOGS/summary"
awk '/^float32/ {f[++nf] = $(NF-1)} /^bfloat16/ {b[++nb] = $(NF-1)}
     function median(a, n,   i, j, t) {for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) {t = a[i]; a[i] = a[j]; a[j] = t}
                                       return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2}
     END {mf = median(f, nf); mb = median(b, nb); printf "median updates/s per training: float32 %.3f, bfloat16 %.3f: %.2fx\n", mf, mb, mb / mf}' \
  "$LOGS/summary"
