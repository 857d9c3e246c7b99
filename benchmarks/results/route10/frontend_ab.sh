#!/usr/bin/env bash
# frontend_ab.sh DONORS REQS ORDER...: the Frontend benchmark for each named tree in the given order (e.g. base this
# this base), output in $OUT; with PROBE=1 the span-path probe in every semantic router. Now route12's script: the
# same runs and staging, whose probe carries this one's marks plus the answers' hand-overs, and prints both reports.
exec bash "$(dirname "$0")/../route12/frontend_ab.sh" "$@"
