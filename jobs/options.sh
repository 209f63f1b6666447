# Sourced by jobs/train-local.sh and jobs/train.sbatch: how a launch script reads the h5ddp-train options it
# was given, so that it adds only what the user did not set. Each option is taken from the first of: the command
# line (the script's arguments and H5DDP_TRAIN_ARGS), a --config FILE, the H5DDP_* variables, the defaults.

# option_value NAME ARGS...: the value of --NAME V or --NAME=V in ARGS (the last one), or nothing.
option_value() {
  local name=$1 found="" next=0 a
  shift
  for a in "$@"; do
    if [ "$next" -eq 1 ]; then
      found=$a
      next=0
      continue
    fi
    case "$a" in
      "--$name") next=1 ;;
      "--$name="*) found=${a#--"$name"=} ;;
    esac
  done
  printf '%s' "$found"
}

# config_value NAME FILE: the value of the last `NAME = V` line of an h5ddp-train --config file, or nothing.
config_value() {
  [ -n "$2" ] && [ -r "$2" ] || return 0
  sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\(.*[^[:space:]]\)[[:space:]]*\$/\1/p" "$2" | tail -n 1
}

# without_resume ARGS...: ARGS less --resume/--init-from and their values, one per line.
without_resume() {
  local skip=0 a
  for a in "$@"; do
    if [ "$skip" -eq 1 ]; then
      skip=0
      continue
    fi
    case "$a" in
      --resume | --init-from) skip=1 ;;
      --resume=* | --init-from=*) ;;
      *) printf '%s\n' "$a" ;;
    esac
  done
}

# resolve_run_dir DEFAULT ARGS...: sets run_dir (the run directory h5ddp-train will use) and dir_args (the
# --run-dir the script must add: none when the command line or the config file names one), and config.
resolve_run_dir() {
  local default=$1
  shift
  config=$(option_value config "$@")
  run_dir=$(option_value run-dir "$@")
  dir_args=()
  if [ -z "$run_dir" ]; then run_dir=$(config_value run-dir "$config"); fi
  if [ -z "$run_dir" ]; then
    run_dir=$default
    dir_args=(--run-dir "$run_dir")
  fi
}
