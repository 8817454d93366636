# Sourced by the launchers of several processes (learner_and_actors.sh, multi_learner.sh): KEY_FILE, the key
# every peer proves (default: the one every rfwp-rl command reads, asked of rfwp_rl.impala.wire.default_key_file),
# made with `rfwp-rl keygen` if missing (mode 600, the key never printed), and copy_key HOST, which puts the
# same file on HOST over ssh.

KEY_FILE=${KEY_FILE:-$(python3 -c "from rfwp_rl.impala.wire import default_key_file; print(default_key_file())")}
if [[ ! -e "$KEY_FILE" ]]; then
  rfwp-rl keygen --auth-key-file "$KEY_FILE" >&2
fi

copy_key() {  # copy_key HOST: the same key file on HOST (mode 600), over ssh
  # shellcheck disable=SC2029
  ssh "$1" "umask 077 && mkdir -p '$(dirname "$KEY_FILE")' && cat > '$KEY_FILE'" < "$KEY_FILE"
}
