#!/bin/sh
# Start a private Docker engine for the sandbox tests and build the trial image.
#
# Run as root. The engine gets its own socket, data root and exec root, and is started with
# --iptables=false --ip-forward=false --ip-masq=false --bridge=none, so it leaves the host's
# firewall and forwarding alone (trial containers use network "none" anyway).
#
# Either source it (it exports DOCKER_HOST) or run it and eval its one line of output:
#   . .ci/docker-up.sh            or    eval "$(.ci/docker-up.sh)"
# holedger also finds the socket without DOCKER_HOST: unix:///run/holedger-docker.sock.
# A failure is reported on stderr and is not fatal: the docker tests then skip, saying why.
# Stop the engine with:  HOLEDGER_DOCKER_STOP=1 .ci/docker-up.sh
# Every name this file defines starts with holedger_/HOLEDGER_ (it may be sourced).

HOLEDGER_DOCKER_SOCK=${HOLEDGER_DOCKER_SOCK:-/run/holedger-docker.sock}
HOLEDGER_DOCKER_ROOT=${HOLEDGER_DOCKER_ROOT:-/var/lib/holedger-docker}
HOLEDGER_DOCKER_RUN=${HOLEDGER_DOCKER_RUN:-/run/holedger-docker}
HOLEDGER_DOCKER_PYTHON=${HOLEDGER_DOCKER_PYTHON:-python3}

holedger_docker_ping() {
    "$HOLEDGER_DOCKER_PYTHON" - "$HOLEDGER_DOCKER_SOCK" <<'PY'
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

holedger_docker_up() {
    if [ "$(id -u)" != 0 ]; then
        echo "docker-up: must run as root" >&2
        return 1
    fi
    if ! command -v dockerd >/dev/null 2>&1; then
        echo "docker-up: dockerd missing (apt-get install docker.io)" >&2
        return 1
    fi
    mkdir -p "$HOLEDGER_DOCKER_ROOT" "$HOLEDGER_DOCKER_RUN" || return 1
    if ! holedger_docker_ping; then
        nohup dockerd -H "unix://$HOLEDGER_DOCKER_SOCK" --data-root "$HOLEDGER_DOCKER_ROOT" \
            --exec-root "$HOLEDGER_DOCKER_RUN/exec" --pidfile "$HOLEDGER_DOCKER_RUN/dockerd.pid" \
            --containerd-namespace holedger --iptables=false --ip-forward=false \
            --ip-masq=false --bridge=none --default-ulimit nofile=4096:4096 \
            >"$HOLEDGER_DOCKER_RUN/dockerd.log" 2>&1 </dev/null &
        holedger_tries=0
        until holedger_docker_ping; do
            holedger_tries=$((holedger_tries + 1))
            if [ "$holedger_tries" -gt 300 ]; then
                echo "docker-up: dockerd did not answer /_ping; its log:" >&2
                tail -20 "$HOLEDGER_DOCKER_RUN/dockerd.log" >&2
                return 1
            fi
            sleep 0.1
        done
    fi
    DOCKER_HOST="unix://$HOLEDGER_DOCKER_SOCK" \
        "$HOLEDGER_DOCKER_PYTHON" -m holedger.cli sandbox build-image --if-needed >&2 || return 1
    return 0
}

if [ -n "${HOLEDGER_DOCKER_STOP:-}" ]; then
    if [ -f "$HOLEDGER_DOCKER_RUN/dockerd.pid" ]; then
        kill "$(cat "$HOLEDGER_DOCKER_RUN/dockerd.pid")" 2>/dev/null || true
    fi
elif holedger_docker_up; then
    export DOCKER_HOST="unix://$HOLEDGER_DOCKER_SOCK"
    echo "export DOCKER_HOST=$DOCKER_HOST"
else
    echo "docker-up: the Docker backend is unavailable; its tests will be skipped" >&2
fi
