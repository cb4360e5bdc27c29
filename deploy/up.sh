#!/usr/bin/env bash
# `make up`: build the images that are missing (deploy/build-images.sh), start the compose
# deployment, wait until every node is healthy, and print the addresses.
#   NODES=5 deploy/up.sh       five nodes (deploy/docker-compose.5nodes.yml)
#   TLS=1 deploy/up.sh         mutual TLS on both gRPC listeners (deploy/docker-compose.tls.yml;
#                              certificates in deploy/.tls, made on first use)
#   NETWORK=host deploy/up.sh  three nodes on the host's network, loopback only
#                              (deploy/docker-compose.host.yml: no docker-proxy between
#                              the host's clients and the nodes)
#   UP_TIMEOUT_S=300           how long to wait for healthy nodes
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nodes="${NODES:-3}"
timeout_s="${UP_TIMEOUT_S:-300}"
network="${NETWORK:-bridge}"
tls="${TLS:-}"
case "$tls" in "" | 0) tls="" ;; 1) ;; *) echo "TLS must be 1 or unset, not $tls" >&2; exit 2 ;; esac
if [ -n "$tls" ] && { [ "$network" = host ] || [ "$nodes" != 3 ]; }; then
  echo "TLS=1 runs the 3 nodes of deploy/docker-compose.yml (not with NETWORK=host or NODES=5)" >&2
  exit 2
fi
case "$nodes" in 3 | 5) ;; *) echo "NODES must be 3 or 5, not $nodes" >&2; exit 2 ;; esac
case "$network" in bridge | host) ;; *) echo "NETWORK must be bridge or host, not $network" >&2; exit 2 ;; esac
if [ "$network" = host ] && [ "$nodes" != 3 ]; then
  echo "NETWORK=host runs 3 nodes (deploy/docker-compose.host.yml), not $nodes" >&2
  exit 2
fi
if command -v docker-compose >/dev/null 2>&1; then compose=(docker-compose); else compose=(docker compose); fi
files=(-f "$here/docker-compose.yml")
[ "$nodes" = 5 ] && files+=(-f "$here/docker-compose.5nodes.yml")
[ "$network" = host ] && files=(-f "$here/docker-compose.host.yml")
[ -n "$tls" ] && files+=(-f "$here/docker-compose.tls.yml")
docker info >/dev/null 2>&1 || { echo "no Docker Engine answers here (docker info failed)" >&2; exit 1; }

began=$(date +%s)
"$here/build-images.sh"

# The project name and the cluster secret live in deploy/.env (compose reads it from
# there): written once, kept, so that a restart finds the same cluster.
env_file="$here/.env"
if [ ! -f "$env_file" ]; then
  umask 077
  {
    echo "# Written by deploy/up.sh on $(date -u +%FT%TZ); read by docker-compose."
    echo "COMPOSE_PROJECT_NAME=headwater"
    echo "HEADWATER_CLUSTER_SECRET=${HEADWATER_CLUSTER_SECRET:-$(python3 -c 'import secrets; print(secrets.token_hex(32))')}"
  } >"$env_file"
  echo "wrote $env_file (project name and cluster secret)"
fi

# TLS=1: a CA and certificates for node1-3 and a client (admin) in deploy/.tls, made once
# and kept (files already there, such as your own CA's, are used as they are). The nodes'
# keys must be readable by the image's user (uid 10001).
tls_dir="$here/.tls"
if [ -n "$tls" ]; then
  if [ ! -f "$tls_dir/ca.crt" ]; then
    hw="${HEADWATER_CLI:-$here/../.venv/bin/headwater}"
    "$hw" tls init "$tls_dir" --node node1 --node node2 --node node3 --client admin
  fi
  for i in 1 2 3; do
    [ -f "$tls_dir/node$i.crt" ] && [ -f "$tls_dir/node$i.key" ] \
      || { echo "$tls_dir lacks node$i.crt or node$i.key" >&2; exit 1; }
  done
  # The nodes run as uid 10001 and read their key (mode 0600): it must be theirs. Without
  # root here, a root container does the chown (Docker's group is root-equivalent anyway).
  if [ "$(id -u)" = 0 ]; then
    chown 10001:10001 "$tls_dir"/node[123].key
  else
    docker run --rm --user 0 --entrypoint chown -v "$tls_dir:/tls" headwater:latest \
      10001:10001 /tls/node1.key /tls/node2.key /tls/node3.key
  fi
fi

"${compose[@]}" "${files[@]}" up -d --remove-orphans

echo "waiting up to ${timeout_s} s for $nodes healthy nodes ..."
deadline=$((began + timeout_s))
while :; do
  healthy=0
  for i in $(seq 1 "$nodes"); do
    id=$("${compose[@]}" "${files[@]}" ps -q "node$i" 2>/dev/null || true)
    [ -n "$id" ] || continue
    state=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$id" 2>/dev/null || true)
    [ "$state" = healthy ] && healthy=$((healthy + 1))
  done
  [ "$healthy" = "$nodes" ] && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "only $healthy of $nodes nodes healthy after ${timeout_s} s; last log lines:" >&2
    "${compose[@]}" "${files[@]}" logs --tail 20 >&2 || true
    exit 1
  fi
  sleep 1
done

bootstrap=""
for i in $(seq 1 "$nodes"); do
  port=$((7700 + 2 * (i - 1)))
  bootstrap="${bootstrap:+$bootstrap,}127.0.0.1:$port"
  echo "node$i: gRPC 127.0.0.1:$port, metrics http://127.0.0.1:$((9100 + i))/metrics"
done
echo "prometheus: http://127.0.0.1:9090 (alerts: http://127.0.0.1:9090/alerts)"
echo "export HEADWATER_BOOTSTRAP=$bootstrap"
if [ -n "$tls" ]; then
  echo "mutual TLS: clients present a certificate signed by $tls_dir/ca.crt"
  echo "export HEADWATER_SECURITY_PROTOCOL=SSL"
  echo "export HEADWATER_TLS_CA_FILE=$tls_dir/ca.crt"
  if [ -f "$tls_dir/admin.crt" ] && [ -f "$tls_dir/admin.key" ]; then
    echo "export HEADWATER_TLS_CERT_FILE=$tls_dir/admin.crt"
    echo "export HEADWATER_TLS_KEY_FILE=$tls_dir/admin.key"
  else
    echo "# and HEADWATER_TLS_CERT_FILE, HEADWATER_TLS_KEY_FILE: a client certificate of your CA"
  fi
fi
echo "$nodes nodes healthy $(($(date +%s) - began)) s after make up"
