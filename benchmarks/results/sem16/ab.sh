#!/usr/bin/env bash
# ab.sh BASE_TREE ROUNDS SCRIPT: SCRIPT (pieces.py or send.py) on BASE_TREE and this checkout in turns, ROUNDS times;
# per piece the best of the rounds and every round's figure. Run from the repository root.
base=$1; rounds=$2; script=$3; this=$PWD
for i in $(seq 1 "$rounds"); do
  for t in "$base" "$this"; do
    label=$([ "$t" = "$this" ] && echo this || echo base)
    python "$script" "$t" 2>&1 | grep " us" | sed "s|^|$label\t|"
  done
done | awk -F'\t' '{split($2, a, ": "); key=$1"\t"a[1]; split(a[2], b, " "); v=b[1]+0; if(!(key in m) || v<m[key]) m[key]=v;
  all[key]=all[key]" "v} END {for (k in m) print k"\tmin "m[k]"\tall"all[k]}' | sort -t$'\t' -k2,2 -k1,1
