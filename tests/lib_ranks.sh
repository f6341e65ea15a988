# Shared by the CPU-rank tests (tests/test_dist.sh, tests/test_pp.sh): Open
# MPI's settings, ok / bad, run (one training run, under mpirun for more
# than one rank), compare (tests/compare_runs.py) and against_one_rank. The
# sourcing test sets bin, py, tmp and the base arguments (base) first.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails+1)); }
command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 1; }
run() { # name np args...
  local name=$1 np=$2; shift 2
  local cmd=("$bin" train configs/tiny.yaml "${base[@]}" --logging.run_dir="$tmp/$name" "$@")
  if [ "$np" -gt 1 ]; then cmd=(mpirun --oversubscribe -np "$np" "${cmd[@]}"); fi
  timeout 300 "${cmd[@]}" >"$tmp/$name.log" 2>&1
}
compare() { # ref run, tol_loss, tol_weights, [first step to compare]
  $py "$(dirname "${BASH_SOURCE[0]}")/compare_runs.py" "$tmp/$1" "$tmp/$2" "$3" "$4" "${5:-1}"
}
# against_one_rank TAG WHAT "ARGS" "ONE-RANK ARGS" LAYOUT...: runs single_TAG on one
# rank with ARGS and ONE-RANK ARGS, then each LAYOUT ("NAME NP ARGS...") as NAME_TAG
# with ARGS, and compares each with the one-rank run (losses within tol_loss,
# weights within tol_weights: 1e-5 where the caller sets neither)
against_one_rank() {
  local tag=$1 what=$2 layout name np
  local -a all=($3) one=($4)
  shift 4
  run "single_$tag" 1 "${all[@]}" "${one[@]}" || { tail "$tmp/single_$tag.log"; bad "single $what failed"; return; }
  for layout in "$@"; do
    set -- $layout
    name=$1 np=$2; shift 2
    if ! run "${name}_$tag" "$np" "${all[@]}" "$@"; then
      tail -n 5 "$tmp/${name}_$tag.log"; bad "$name $what: run failed"; continue
    fi
    if out=$(compare "single_$tag" "${name}_$tag" "${tol_loss:-1e-5}" "${tol_weights:-1e-5}"); then ok "$name $what: $out"
    else bad "$name $what: $out"; fi
  done
}
