#!/usr/bin/env bash
# Second stage of tools/mutation.sh: the seeded simulation (tests/sim, against a real
# PostgreSQL) run against each mutant the unit tests left alive (mutants/survivors.txt), in
# the copy mutmut made (mutants/: the mutated package, every mutant switched off but the
# one MUTANT_UNDER_TEST names). A mutant is killed when the simulation reports a violation
# (exit 1), fails otherwise, or runs past LIMIT seconds.
#
#   tools/mutation_sim.sh                    # seeds 0..1, 10 scenarios each
#   SEEDS=1 EVERY=5 tools/mutation_sim.sh    # one seed, every fifth survivor
#   NAMES=list.txt tools/mutation_sim.sh     # only the mutants named in list.txt
#   MUTANTS=/tmp/copy tools/mutation_sim.sh  # a copy of mutants/ (stage 1 may run again)
#
# Writes mutants/sim_results.txt (name: survived | violation | error | timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$PWD/.venv/bin/python}
[ -x "$PY" ] || PY=python
[ -z "${NAMES:-}" ] || NAMES=$(realpath "$NAMES")
cd "${MUTANTS:-mutants}"
SEEDS=${SEEDS:-2}
PER_SEED=${PER_SEED:-10}
EVERY=${EVERY:-1}
LIMIT=${LIMIT:-600}

sim() {
    MUTANT_UNDER_TEST="$1" PYTHONPATH="$PWD" timeout "$LIMIT" "$PY" -m tests.sim \
        --first 0 --seeds "$SEEDS" --per-seed "$PER_SEED" --budget 100000 >/dev/null 2>&1
}

start=$(date +%s)
if ! sim ""; then
    echo "the simulation fails with no mutant switched on: nothing to measure" >&2
    exit 1
fi
echo "baseline: $(($(date +%s) - start)) s"
: >sim_results.txt
while read -r name; do
    if sim "$name"; then
        verdict=survived
    else
        case $? in
            1) verdict=violation ;;
            124) verdict=timeout ;;
            *) verdict=error ;;
        esac
    fi
    echo "$name: $verdict" | tee -a sim_results.txt
done < <(
    if [ -n "${NAMES:-}" ]; then cat "$NAMES"; else awk -F': ' '$2 == "survived" {print $1}' survivors.txt; fi |
        awk -v k="$EVERY" 'NR % k == 0'
)
end=$(date +%s)
total=$(wc -l <sim_results.txt)
alive=$(grep -c ': survived$' sim_results.txt || true)
echo "wall time: $((end - start)) s; killed by the simulation: $((total - alive)) of $total"
