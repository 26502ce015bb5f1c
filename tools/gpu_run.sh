# Sourced by the staged GPU scripts (tools/sm90_bwd_gpu.sh, tools/ssd_pending_gpu.sh).
# run NAME LIMIT_S CMD...: CMD killed after LIMIT_S seconds (a hang shows as rc 137), logged to
# $RUN_LOGS/NAME.log (default $OUT), its last $RUN_TAIL lines (default 30) and its rc printed,
# the rc kept in $OUT/summary.txt.
run() {
  local name=$1 limit=$2 logs=${RUN_LOGS:-$OUT}
  shift 2
  echo "=== $name"
  timeout -s KILL "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  tail -n "${RUN_TAIL:-30}" "$logs/$name.log"
  echo "=== $name rc=$rc"
  echo "$name rc=$rc" >>"$OUT/summary.txt"
}
