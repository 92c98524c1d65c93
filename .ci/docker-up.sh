#!/bin/sh
# Start a private Docker engine for the sandbox tests and build the trial image.
#
# Run as root. The engine gets its own socket, data root and exec root, and is started with
# --iptables=false --ip-forward=false --ip-masq=false --bridge=none, so it leaves the host's
# firewall and forwarding alone (trial containers use network "none" anyway).
# Prints one line to source:   eval "$(.ci/docker-up.sh)"
#   export DOCKER_HOST=unix:///run/holedger-docker.sock
# holedger also finds that socket without DOCKER_HOST. Stop with: .ci/docker-up.sh stop
set -eu

SOCK=${HOLEDGER_DOCKER_SOCK:-/run/holedger-docker.sock}
ROOT=${HOLEDGER_DOCKER_ROOT:-/var/lib/holedger-docker}
RUN=${HOLEDGER_DOCKER_RUN:-/run/holedger-docker}
PYTHON=${PYTHON:-python3}

if [ "${1:-}" = stop ]; then
    if [ -f "$RUN/dockerd.pid" ]; then
        kill "$(cat "$RUN/dockerd.pid")" 2>/dev/null || true
    fi
    exit 0
fi

[ "$(id -u)" = 0 ] || { echo "docker-up: must run as root" >&2; exit 2; }
command -v dockerd >/dev/null || { echo "docker-up: dockerd missing (apt-get install docker.io)" >&2; exit 2; }
mkdir -p "$ROOT" "$RUN"

ping() {
    "$PYTHON" - "$SOCK" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(2)
try:
    s.connect(sys.argv[1])
    s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
    sys.exit(0 if b"200 OK" in s.recv(4096) else 1)
except OSError:
    sys.exit(1)
PY
}

if ! ping; then
    nohup dockerd -H "unix://$SOCK" --data-root "$ROOT" --exec-root "$RUN/exec" \
        --pidfile "$RUN/dockerd.pid" --containerd-namespace holedger \
        --iptables=false --ip-forward=false --ip-masq=false --bridge=none \
        --default-ulimit nofile=4096:4096 >"$RUN/dockerd.log" 2>&1 </dev/null &
    i=0
    until ping; do
        i=$((i + 1))
        if [ "$i" -gt 300 ]; then
            echo "docker-up: dockerd did not answer /_ping; see $RUN/dockerd.log" >&2
            tail -20 "$RUN/dockerd.log" >&2
            exit 1
        fi
        sleep 0.1
    done
fi

DOCKER_HOST="unix://$SOCK" "$PYTHON" -m holedger.cli sandbox build-image >&2
echo "export DOCKER_HOST=unix://$SOCK"
