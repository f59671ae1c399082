#!/usr/bin/env bash
# Install lossguard as a systemd service on a Debian/Ubuntu-like box (run as root). Idempotent.
#
#   deploy/install.sh                 install or upgrade from this checkout
#   deploy/install.sh --root DIR      stage the install in DIR (packaging, tests): no user is created,
#                                     systemctl is not called, and the program's scripts name
#                                     /opt/lossguard/venv, where the package will put them
#   deploy/install.sh --uninstall     remove the program and the units; keep config and state
#   deploy/install.sh --uninstall --purge   ...and remove /etc/lossguard and the state too
set -euo pipefail

ROOT=""
UNINSTALL=0
PURGE=0
SOURCE="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
while [ $# -gt 0 ]; do
    case "$1" in
        --root|--prefix) ROOT="${2%/}"; shift 2 ;;
        --root=*|--prefix=*) ROOT="${1#*=}"; ROOT="${ROOT%/}"; shift ;;
        --uninstall) UNINSTALL=1; shift ;;
        --purge) PURGE=1; shift ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
ROOT="${ROOT:-${DESTDIR:-}}"

OPT="$ROOT/opt/lossguard"
ETC="$ROOT/etc/lossguard"
UNITS="$ROOT/etc/systemd/system"
STATE="$ROOT/var/lib/lossguard"
live() { [ -z "$ROOT" ]; }

if [ "$UNINSTALL" = 1 ]; then
    if live && command -v systemctl >/dev/null; then
        systemctl disable --now lossguard.service lossguard-scan.timer 2>/dev/null || true
    fi
    rm -f "$UNITS/lossguard.service" "$UNITS/lossguard-scan.service" "$UNITS/lossguard-scan.timer"
    rm -rf "$OPT"
    if [ "$PURGE" = 1 ]; then
        rm -rf "$ETC" "$STATE" "$ROOT/var/lib/lossguard-scan" "$ROOT/var/lib/private/lossguard" "$ROOT/var/lib/private/lossguard-scan"
        echo "lossguard removed, with its configuration and state."
    else
        echo "lossguard removed. Kept: $ETC (configuration) and the state under /var/lib/lossguard (use --purge to remove them)."
    fi
    if live && command -v systemctl >/dev/null; then systemctl daemon-reload || true; fi
    exit 0
fi

if live; then
    [ "$(id -u)" = 0 ] || { echo "install.sh: run as root (or use --root DIR)" >&2; exit 2; }
    if ! getent passwd lossguard >/dev/null; then
        useradd --system --user-group --home-dir /var/lib/lossguard --no-create-home --shell /usr/sbin/nologin lossguard
    fi
fi

mkdir -p "$OPT" "$ETC" "$UNITS"
if [ ! -x "$OPT/venv/bin/python" ]; then
    "$PYTHON" -m venv "$OPT/venv"
fi
"$OPT/venv/bin/python" -m pip install --quiet --upgrade "$SOURCE[notify]"  # (notification URLs: apprise)
if ! live; then
    # A staged install: the scripts' shebangs must name where the venv will live, not the stage.
    grep -rlIF --null "$OPT/venv" "$OPT/venv/bin" | xargs -0 -r sed -i "s|$OPT/venv|/opt/lossguard/venv|g"
fi

# The user's configuration is never overwritten. It may hold a token or webhook URL: readable by
# root and the service's group only.
if [ ! -e "$ETC/lossguard.toml" ]; then
    if live; then GROUP=lossguard; else GROUP="$(id -g)"; fi
    install -m 0640 -g "$GROUP" "$SOURCE/deploy/lossguard.toml" "$ETC/lossguard.toml"
    CREATED_CONFIG=1
fi
# The units load these credentials; an empty one means "not set" (a webhook setup has no bot token,
# most have no Alertmanager password), so they always exist and a start never fails for want of one.
for credential in slack_token slack_app_token slack_webhook_url alertmanager_password alertmanager_bearer_token notify_urls; do
    if [ ! -e "$ETC/$credential" ]; then
        install -m 0600 /dev/null "$ETC/$credential"
    fi
done
for unit in lossguard.service lossguard-scan.service lossguard-scan.timer; do
    install -m 0644 "$SOURCE/systemd/$unit" "$UNITS/$unit"
done
chmod 0755 "$ETC"

if live && command -v systemctl >/dev/null; then systemctl daemon-reload || true; fi

cat <<MSG
lossguard installed in $OPT (config: $ETC/lossguard.toml${CREATED_CONFIG:+, written from the example}).
Two steps remain:
  1. Slack: put the bot token in $ETC/slack_token (it is mode 600, owned by root), set [slack] channel
     and the runs folders (paths = [...]) in $ETC/lossguard.toml, then check it:
        $OPT/venv/bin/lossguard config check --config $ETC/lossguard.toml
  2. Start it:   systemctl enable --now lossguard.service   (and lossguard-scan.timer for a nightly report)
MSG
