#!/usr/bin/env bash
# The matched-updates study's sweep, resumable: run it again to continue (finished runs
# are skipped, killed ones resume from their checkpoints; each finished run is committed).
#   1. the 24 SFT starts (no RL run), the 8 at H = 48 first (stopping there if one misses
#      the band);
#   2. the gate: every start in the notes' band (sft_band.py), else stop before any RL run;
#   3. the matched arm: grpo, csa, csa_state at H = 4, 16, 48, seed by seed;
#   4. the mechanism arms at H = 4 on the same starts (csa_t0 and csa_routine once their
#      estimators exist: the sweep refuses unknown experiments, so this step then says so).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
JOBS=${JOBS:-2}
FAMILIES=keydoor_matched_h4,keydoor_matched_h16,keydoor_matched_h48
# The H = 48 starts first: the horizon where a recipe is likeliest to miss the band.
$PY -m studies.sweep --family keydoor_matched_h48 --by-family --methods "" --seeds 8 \
    --name horizon_matched --jobs "$JOBS" --commit || exit 1
$PY reports/horizon_matched/sft_band.py --horizons 48 || exit 1
$PY -m studies.sweep --family "$FAMILIES" --methods "" --seeds 8 --name horizon_matched \
    --jobs "$JOBS" --commit || exit 1
$PY reports/horizon_matched/sft_band.py || exit 1
# The predictions must be committed before the first RL run.
git log -1 --format=%H -- reports/horizon_matched/notes.md | grep -q . \
    || { echo "reports/horizon_matched/notes.md (the predictions) is not committed" >&2; exit 1; }
$PY -m studies.sweep --family "$FAMILIES" --methods grpo,csa,csa_state --seeds 8 \
    --name horizon_matched --jobs "$JOBS" --commit || exit 1
$PY -m studies.sweep --family keydoor_matched_h4 --by-family \
    --methods grpo_lr2x,grpo_decisive --seeds 8 --name horizon_matched --jobs "$JOBS" \
    --commit || exit 1
$PY -m studies.sweep --family keydoor_matched_h4 --by-family \
    --methods csa_t0,csa_routine --seeds 8 --name horizon_matched --jobs "$JOBS" --commit
