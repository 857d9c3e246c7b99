#!/usr/bin/env bash
# graph_ab.sh OUT DONORS REQS ROUNDS BASE_TREE: the whole Frontend benchmark on BASE_TREE (a main tree, its compiled
# modules built: the old seeding) and on this checkout in turns (base first in odd rounds), each run's output in
# OUT/frontend_<round>_<tree>.txt with its wall time and the semantic router's "seeded ... in N s" line. Run from the
# repo root.
set -u
out=$1; donors=$2; reqs=$3; rounds=$4; base=$5
here=$PWD
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="base this"; else order="this base"; fi
  for t in $order; do
    root=$([ "$t" = base ] && echo "$base" || echo "$here")
    f="$out/frontend_${r}_$t.txt"
    start=$(date +%s)
    (cd "$root" && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$root" timeout 900 python -m benchmarks.frontend_path.run \
      --donors "$donors" --requests "$reqs") > "$f" 2>&1
    echo "rc=$? wall=$(( $(date +%s) - start )) s $(uptime)" >> "$f"
    logs=$(head -1 "$f" | sed -n 's/.*(logs \(.*\))$/\1/p')
    [ -n "$logs" ] && grep -h "seeded .* resident donors" "$logs/router-sem.log" | sed 's/^.* INFO /# /' >> "$f"
    sed -i 's|(logs [^)]*)|(logs <workdir>)|' "$f"
    echo "== round $r $t: $(head -1 "$f") | $(tail -2 "$f" | tr '\n' ' ')"
  done
done
