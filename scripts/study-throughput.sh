#!/usr/bin/env bash
# Training throughput of the CPU study's model with and without one change, measured in the layout the
# study trains in (JOBS trainings side by side, the cores / JOBS threads each), the two
# variants in turn, ROUNDS times, so that machine noise hits both alike. Prints updates/s per training
# for each round and the ratio of the medians (variant / baseline). Stop the study's trainings first:
# anything beside them is measured slower and slows them. COMPARE names the change:
#   bf16      float32 against --bf16 --memory-efficient-bf16 (default)
#   tcmalloc  glibc's malloc against tcmalloc (LD_PRELOAD=TCMALLOC): the same computation, so the same
#             losses; fewer page faults from the large per-batch tensors freed and allocated again
#
#   bash scripts/study-throughput.sh [DATA_BIN]     # default: runs/data/paper/bible_de_en_full/bin
#   UPDATES=125 ROUNDS=2 JOBS=2 SETTING=cpu_faithful COMPARE=tcmalloc bash scripts/study-throughput.sh
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
COMPARE=${COMPARE:-bf16}
TCMALLOC=${TCMALLOC:-$(ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 2>/dev/null | head -1 || true)}
THREADS=$(( $(nproc) / JOBS > 0 ? $(nproc) / JOBS : 1 ))
mapfile -d '' STUDY_TRAIN < <("$PYTHON" -c 'import shlex, sys, yaml
settings = yaml.safe_load(open("fairseq_sparse/configs/papers/study.yaml"))["settings"]
train = settings.get(sys.argv[1], {}).get("train", "")
sys.stdout.write("".join(word + "\0" for word in shlex.split(train)))' "$SETTING")
[ ${#STUDY_TRAIN[@]} -gt 0 ] || { echo "study-throughput.sh: no training options for setting $SETTING in configs/papers/study.yaml" >&2; exit 2; }
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT

train_pair() {  # $1: tag; $2: LD_PRELOAD (may be empty); the rest: extra options
  local tag=$1 preload=$2; shift 2
  for job in $(seq 1 "$JOBS"); do
    LD_PRELOAD=$preload OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS "$PYTHON" -m fairseq_sparse.train "$DATA" --user-dir fairseq_sparse \
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

case $COMPARE in
  bf16) BASE=float32 VARIANT=bfloat16 ;;
  tcmalloc) BASE=glibc-malloc VARIANT=tcmalloc
            [ -f "$TCMALLOC" ] || { echo "study-throughput.sh: no tcmalloc library (apt-get install libtcmalloc-minimal4, or set TCMALLOC)" >&2; exit 2; } ;;
  *) echo "study-throughput.sh: COMPARE must be bf16 or tcmalloc, not '$COMPARE'" >&2; exit 2 ;;
esac
for round in $(seq 1 "$ROUNDS"); do
  train_pair "$BASE round $round" ""
  if [ "$COMPARE" = bf16 ]; then
    train_pair "$VARIANT round $round" "" --bf16 --memory-efficient-bf16
  else
    train_pair "$VARIANT round $round" "$TCMALLOC"
  fi
done | tee "$LOGS/summary"
awk -v base="$BASE" -v variant="$VARIANT" '$1 == base {f[++nf] = $(NF-1)} $1 == variant {b[++nb] = $(NF-1)}
     function median(a, n,   i, j, t) {for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) {t = a[i]; a[i] = a[j]; a[j] = t}
                                       return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2}
     END {mf = median(f, nf); mb = median(b, nb); printf "median updates/s per training: %s %.3f, %s %.3f: %.2fx\n", base, mf, variant, mb, mb / mf}' \
  "$LOGS/summary"
if [ "$COMPARE" = tcmalloc ]; then  # the allocator must not change what is computed
  for job in $(seq 1 "$JOBS"); do
    if cmp -s <(grep -oE ' loss=[0-9.]+' "$LOGS/$BASE round 1.$job.log") <(grep -oE ' loss=[0-9.]+' "$LOGS/$VARIANT round 1.$job.log"); then
      echo "job $job: the same training losses with either allocator"
    else
      echo "job $job: training losses DIFFER between the allocators" >&2; exit 1
    fi
  done
fi
