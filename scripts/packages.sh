# shellcheck shell=bash
# Sourced by scripts/setup, scripts/test and scripts/reliability: installs what is missing of a
# list of Debian packages. `ferry_apt_install WHO PACKAGE...` asks dpkg which are installed,
# and installs the others with apt-get (as root), saying which; a package already there costs
# nothing, so each script lists everything it needs.
ferry_apt_install() {
  local who=$1
  shift
  local missing=() p
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "$who: missing Debian packages: ${missing[*]}; install them as root" \
      "(apt-get install ${missing[*]}) or run $who as root" >&2
    return 1
  fi
  echo "$who: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null || return 1
}
