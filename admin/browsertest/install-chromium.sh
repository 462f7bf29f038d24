#!/bin/sh
# install-chromium.sh installs Debian's chromium package, which the browser
# tests of github.com/inproc/broker/admin/browsertest drive headless, unless
# a chromium is already on the PATH (or CHROMIUM names one).
# It runs apt-get update only when the package is not known yet, and works as
# root or through sudo.
set -eu

if [ -n "${CHROMIUM:-}" ] && [ -x "$CHROMIUM" ]; then
	echo "chromium: $CHROMIUM"
	exit 0
fi
if command -v chromium >/dev/null 2>&1; then
	echo "chromium: $(command -v chromium)"
	exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
	SUDO=
elif command -v sudo >/dev/null 2>&1; then
	SUDO="sudo -n"
else
	echo "install-chromium.sh: not root and no sudo: install the chromium package yourself" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-chromium.sh: no apt-get: install chromium (or Chrome) yourself and set CHROMIUM to its path" >&2
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Update the package lists only when they do not know chromium yet.
if ! apt-cache show chromium >/dev/null 2>&1; then
	$SUDO apt-get update
fi
$SUDO apt-get install -y --no-install-recommends chromium fonts-liberation

command -v chromium >/dev/null 2>&1 || {
	echo "install-chromium.sh: chromium is still not on the PATH" >&2
	exit 1
}
echo "chromium: $(command -v chromium)"
