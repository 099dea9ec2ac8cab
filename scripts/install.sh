# Sourced by scripts/test.sh and scripts/bench/lib.sh.

# install_packages PACKAGE...: installs Debian packages with apt-get; says what it installs, and says so
# before it uses sudo (as a user other than root).
install_packages() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
    echo "installing $* with apt-get, through sudo (it may ask for your password)" >&2
  else
    echo "installing $* with apt-get" >&2
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# install_missing COMMAND=PACKAGE[,PACKAGE]...: installs the packages of each command not on the PATH.
install_missing() {
  local need=() spec packages
  for spec in "$@"; do
    packages=${spec#*=}
    command -v "${spec%%=*}" >/dev/null || need+=(${packages//,/ })
  done
  [ ${#need[@]} -eq 0 ] || install_packages "${need[@]}"
}
