#!/usr/bin/env bash
# test.sh runs every test of every module of the repository under the race
# detector, and first installs what those tests need when it is missing:
#
#   - a C compiler (the race detector needs cgo): Debian's gcc;
#   - a headless browser for the admin page's browser tests: Debian's
#     chromium, through admin/browsertest/install-chromium.sh.
#
# On a machine with Go and the package registries (the Go module proxy,
# Debian's archive) it passes from a fresh clone. Installing needs root or
# sudo; with a compiler and a browser already there it installs nothing.
# Arguments are passed to go test (for example ./test.sh -run TestChaos).
set -euo pipefail
cd "$(dirname "$0")"

as_root() {
	if [ "$(id -u)" -eq 0 ]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1; then
		sudo -n "$@"
	else
		echo "test.sh: not root and no sudo: install $* yourself" >&2
		return 1
	fi
}

echo "== C compiler for -race"
cc=$(go env CC)
if ! command -v "${cc%% *}" >/dev/null 2>&1; then
	if ! command -v apt-get >/dev/null 2>&1; then
		echo "test.sh: no C compiler ($cc) and no apt-get: install gcc, or set CC" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-cache show gcc >/dev/null 2>&1 || as_root apt-get update
	as_root apt-get install -y --no-install-recommends gcc libc6-dev
fi
echo "cc: $(command -v "${cc%% *}")"

echo "== chromium for the admin page's browser tests"
admin/browsertest/install-chromium.sh

# Every module that go.work lists: the core (./...) and each module of its
# own below it (./natsjs/..., ./bench/..., ...).
root=$(pwd -P)
patterns=()
while IFS= read -r dir; do
	rel=${dir#"$root"}
	patterns+=(".${rel}/...")
done < <(go list -m -f '{{.Dir}}')

echo "== go test -race -count=1 ${patterns[*]}"
go test -race -count=1 "$@" "${patterns[@]}"
