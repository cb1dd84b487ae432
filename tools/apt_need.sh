# shellcheck shell=bash
# Sourced by tools/build.sh and tools/fuzz.sh.  apt_need PKG...: installs
# (Debian, with sudo unless root) those of the packages not installed yet.
apt_need() {
    local need=() pkg sudo=""
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
    done
    [ ${#need[@]} -gt 0 ] || return 0
    [ "$(id -u)" = 0 ] || sudo=sudo
    echo "installing: ${need[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}
