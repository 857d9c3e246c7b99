#!/usr/bin/env bash
# vm_ab.sh OUT DONORS REQS ROUNDS BASE_TREE: the Frontend benchmark with the span-path probe on BASE_TREE and this
# checkout in turns. Now route12's script: the same runs, whose probe carries this one's marks plus the answers'
# hand-overs, and writes both reports.
exec bash "$(dirname "$0")/../route12/vm_ab.sh" "$@"
