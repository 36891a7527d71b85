# Sourced by the scripts/install_*.sh scripts: what they share.
# have CMD: CMD is on PATH.
have() { command -v "$1" >/dev/null 2>&1; }

# apt_install WHO PACKAGE...: Debian's packages, as root or through sudo, announced as WHO.
apt_install() {
    local who=$1 sudo=""
    shift
    [[ "$(id -u)" -ne 0 ]] && sudo="sudo"
    echo "$who: apt-get install $*"
    ${sudo} apt-get update
    DEBIAN_FRONTEND=noninteractive ${sudo} apt-get install -y --no-install-recommends "$@"
}
