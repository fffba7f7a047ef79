#!/usr/bin/env bash
# The horizon study's sweep, resumable: run it again to continue (finished runs are
# skipped, killed ones resume from their checkpoints). Each finished run is committed.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
JOBS=${JOBS:-2}
# Main arm: every horizon, 8 seeds.
$PY -m studies.sweep --family keydoor_h4,keydoor_h16,keydoor_h48 \
    --methods grpo,csa,csa_state --seeds 8 --name horizon --jobs "$JOBS" --commit
# Second arm: the other methods at the longest horizon, 5 seeds (their SFT starts are
# the main arm's: the same runs under runs/sweeps/horizon/keydoor_h48/).
$PY -m studies.sweep --family keydoor_h48 --by-family \
    --methods gigpo,csa_lam1,dapo,csa_dapo,istar,spa,mtdpo --seeds 5 --name horizon \
    --jobs "$JOBS" --commit
