# Sourced by the sweep launchers (memory_suite.sh, minatar.sh): a run's record, written as soon as the
# run finishes and committed with the tables, keeps the run from being trained again; each run's line says
# where the sweep is (K/N).

numbered() {  # each line of stdin as "K/N LINE" (N: the lines in all)
  local lines
  lines=$(cat)
  awk -v n="$(printf '%s\n' "$lines" | grep -c .)" 'NF { print ++k "/" n, $0 }' <<< "$lines"
}

kept() {  # RECORD: true if it is the record of a finished run of at least $STEPS env steps (raising STEPS trains on)
  [ -f "$1" ] && [ "$(grep -o '"total_steps":[0-9]*' "$1" | cut -d: -f2)" -ge "$STEPS" ] 2>/dev/null
}

recorded() {  # NAME DIR RESULTS-COMMAND...: after a run's training, its record or why there is none (in DIR.log)
  local name="$1" dir="$2"
  shift 2
  if python3 -m rfwp_rl "$@" --runs "$RUNS" --out "$OUT" --record "$dir" >> "$dir.log" 2>&1; then
    echo "done    $name"
  else
    echo "stopped $name (no record: why in $dir.log)"
  fi
}
