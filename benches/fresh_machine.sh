#!/bin/sh
# The "fresh machine, one edit" scenario of the layers issue, for one or more
# charly binaries side by side in one run:
#
#   store A + a loopback registry R build the example (all boxes) and push;
#   the last candy of `hello` (hello-deb) gets an env entry;
#   store B, on a fresh podman storage, with the same R, builds `hello`;
#   the image runs (`hello-charly`).
#
# Prints, per binary: A's cold time, B's time, the nodes that ran in B and
# the bytes in A's store and the registry.
#
#   benches/fresh_machine.sh NAME=BIN [NAME=BIN...]
#   e.g. benches/fresh_machine.sh before=/work/wt/target-old/release/charly \
#                                 after=target/release/charly
#
# Needs podman, debootstrap, docker-registry, network to the Debian mirror
# and npm. Uses the host CA bundle (--ca-bundle) when present.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
ca=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca" ] && export CHARLY_CA_BUNDLE="$ca"
export NO_COLOR=1

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now_ms() { date +%s%3N; }

for spec in "$@"; do
    name=${spec%%=*}
    bin=$(cd "$(dirname "${spec#*=}")" && pwd)/$(basename "${spec#*=}")
    work=$(mktemp -d /tmp/charly-fresh-XXXXXX)
    port=$(free_port)
    mkdir -p "$work/registry"
    cat > "$work/registry.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: 127.0.0.1:$port
  secret: charly-bench
EOF
    /usr/bin/docker-registry serve "$work/registry.yml" > "$work/registry.log" 2>&1 &
    reg=$!
    trap 'kill $reg 2>/dev/null || true' EXIT
    sleep 1
    remote="oci://127.0.0.1:$port/charly/fresh"
    cp -r "$here/examples/hello" "$work/proj"

    t0=$(now_ms)
    CHARLY_CACHE_DIR="$work/a" CHARLY_PODMAN_ROOT="$work/pa" \
        "$bin" -C "$work/proj" --remote "$remote" box build --all --dev-local-pkg -q
    t1=$(now_ms)
    sed -i 's/^    localpkg:/    env:\n        HELLO_EDITED: "yes"\n    localpkg:/' \
        "$work/proj/candy/hello-deb/charly.yml"
    CHARLY_CACHE_DIR="$work/b" CHARLY_PODMAN_ROOT="$work/pb" \
        "$bin" -C "$work/proj" --remote "$remote" box build hello --dev-local-pkg -q \
        --summary-json "$work/b.json"
    t2=$(now_ms)
    out=$(CONTAINERS_CONF="$work/b/podman/containers.conf" podman --root "$work/pb/storage" \
        --runroot "$work/pb/run" run --rm localhost/hello:2026.12.1 sh -c 'hello-charly; echo $HELLO_EDITED')
    ran=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(" ".join(n["id"] for n in s["nodes"] if n["state"]=="ran" and not n["id"].startswith("source:")))' "$work/b.json")
    echo "$name: A cold $((t1 - t0)) ms; B after one edit $((t2 - t1)) ms; B ran: $ran"
    echo "$name: store A $(du -sb "$work/a/blobs" | cut -f1) bytes; registry $(du -sb "$work/registry" | cut -f1) bytes; image says: $(echo "$out" | tr '\n' ' ')"
    kill $reg 2>/dev/null || true
    wait $reg 2>/dev/null || true
    trap - EXIT
    # podman's overlay storage needs podman to remove it.
    for p in pa pb; do
        podman --root "$work/$p/storage" --runroot "$work/$p/run" system reset -f >/dev/null 2>&1 || true
    done
    rm -rf "$work"
done
