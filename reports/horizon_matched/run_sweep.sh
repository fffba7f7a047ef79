#!/usr/bin/env bash
# The matched-updates study's sweep, resumable: run it again to continue (finished runs
# are skipped, killed ones resume from their checkpoints; each finished run is committed,
# and each SFT start's weights too, under starts/, so a fresh machine restores them).
#   1. the SFT starts (no RL run), the H = 48 ones first;
#   2. the gate, the notes' inclusion rule (sft_band.py --select): a seed with a start
#      outside the band is excluded and the next seed takes its place, until 8 seeds have
#      all three starts in the band (no RL run before);
#   3. every H = 4 run (the matched arm's grpo, csa, csa_state and the mechanism arms on the
#      same starts), seed by seed;
#   4. the matched arm at H = 16, then at H = 48, seed by seed.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
JOBS=${JOBS:-2}
BAND=reports/horizon_matched/sft_band.py
# The inclusion rule moves an excluded seed's starts to sft_excluded/ (and drops its kept
# weights): committed at once.
commit_band() {
  git add -A reports/horizon_matched/runs reports/horizon_matched/sft_excluded \
      reports/horizon_matched/starts
  git diff --cached --quiet || git commit -q -m "sweep horizon_matched: the inclusion rule excludes $1"
}
# Steps 1-2 until the rule holds: starts of the first 8 seeds not excluded, H = 48 first
# (the horizon where a start is likeliest to miss the band), then H = 4 and 16.
for horizons in 48 4,16,48; do
  while :; do
    SEEDS=$($PY $BAND --select 8 --horizons "$horizons"); rc=$?
    commit_band "seeds outside the band at H = $horizons"
    [ $rc -eq 0 ] && break
    [ $rc -eq 3 ] || exit 1
    fams=$(echo "$horizons" | sed -E 's/([0-9]+)/keydoor_matched_h\1/g')
    $PY -m studies.sweep --family "$fams" --by-family --methods "" --seed-list "$SEEDS" \
        --name horizon_matched --jobs "$JOBS" --commit --keep-starts || exit 1
  done
done
echo "the seeds of the study: $SEEDS"
# The predictions must be committed before the first RL run.
git log -1 --format=%H -- reports/horizon_matched/notes.md | grep -q . \
    || { echo "reports/horizon_matched/notes.md (the predictions) is not committed" >&2; exit 1; }
# One horizon at a time, H = 4 first (its matched and mechanism runs), then 16, then 48. The
# runs are the same in any order (each depends on its seed and its start alone).
$PY -m studies.sweep --family keydoor_matched_h4 --by-family \
    --methods grpo,csa,csa_state,grpo_lr2x,grpo_decisive,csa_t0,csa_routine \
    --seed-list "$SEEDS" --name horizon_matched --jobs "$JOBS" --commit --keep-starts || exit 1
for h in 16 48; do
  $PY -m studies.sweep --family keydoor_matched_h$h --by-family --methods grpo,csa,csa_state \
      --seed-list "$SEEDS" --name horizon_matched --jobs "$JOBS" --commit --keep-starts || exit 1
done
