#!/usr/bin/env bash
# Mutation testing of durable's pure core (durable/_core/ and durable/_core/lifecycle.py)
# with mutmut 3, against the unit tests that need no database: the files to mutate and
# the tests are in pyproject.toml ([tool.mutmut]). docs/guarantees.md has the results
# (pip install -e '.[mutation]' installs mutmut).
#
#   tools/mutation.sh              # a fresh run, 2 processes
#   CHILDREN=1 tools/mutation.sh   # on a busy machine
#   KEEP=1 tools/mutation.sh       # reuse ./mutants (mutmut reruns what changed)
#
# Prints the wall time and the score; the surviving mutants are listed in
# mutants/survivors.txt (`mutmut show <name>` shows one's diff).
set -euo pipefail
cd "$(dirname "$0")/.."
MUTMUT=${MUTMUT:-.venv/bin/mutmut}
[ -x "$MUTMUT" ] || MUTMUT=mutmut
CHILDREN=${CHILDREN:-2}
[ -n "${KEEP:-}" ] || rm -rf mutants
start=$(date +%s)
"$MUTMUT" run --max-children "$CHILDREN" >/dev/null
end=$(date +%s)
"$MUTMUT" results --all true >mutants/results.txt
grep -v ': killed$' mutants/results.txt | sed 's/^ *//' >mutants/survivors.txt || true
awk -v secs=$((end - start)) '
    { n[$NF == "tests" ? "no tests" : $NF]++; total++ }
    END {
        printf "wall time: %dm%02ds\n", secs / 60, secs % 60
        for (s in n) printf "%-10s %5d\n", s, n[s]
        printf "score: %d / %d killed = %.1f%%\n", n["killed"], total, 100 * n["killed"] / total
    }' mutants/results.txt
