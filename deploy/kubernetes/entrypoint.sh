#!/bin/sh
# Container entrypoint of the iggy-replicator StatefulSet: derives [node] id from
# the pod ordinal (iggy-replicator-0 -> 1), renders the config template, waits
# until this pod's stable DNS name resolves (the Raft address peers dial), then
# replaces itself with the replicator so that it receives SIGTERM directly.
set -eu

template="${REPLICATOR_CONFIG_TEMPLATE:-/etc/iggy-replicator/template/replicator.toml}"
config="${REPLICATOR_CONFIG:-/run/iggy-replicator/replicator.toml}"

# pod, node_id and fqdn (pod.sh, mounted beside this script).
script=entrypoint
. "$(dirname "$0")/pod.sh"

grep -q '@NODE_ID@' "$template" || {
  echo "entrypoint: $template has no @NODE_ID@ placeholder" >&2
  exit 2
}
sed "s/@NODE_ID@/$node_id/g" "$template" > "$config.tmp"
mv "$config.tmp" "$config"

# Bounded wait for the headless Service to publish this pod (publishNotReadyAddresses);
# the replicator binds and advertises this name.
tries=0
until getent hosts "$fqdn" > /dev/null 2>&1; do
  tries=$((tries + 1))
  if [ "$tries" -ge 60 ]; then
    echo "entrypoint: $fqdn does not resolve yet; starting anyway" >&2
    break
  fi
  sleep 1
done

echo "entrypoint: pod $pod is node $node_id, config $config" >&2
exec iggy-replicator run --config "$config" --log-format json
