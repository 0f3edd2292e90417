#!/bin/sh
# The `join` container of the iggy-replicator chart's StatefulSet. The first
# INITIAL_MEMBERS pods found the cluster through `initial_members` and have
# nothing to do here. A pod with a higher ordinal is not in `initial_members`:
# once its own admin API answers, this asks a founding member to add it
# (`iggy-replicator cluster add`: learner, catch up, voter), trying the founding
# members in turn until one succeeds. Adding a node that is already a voter
# succeeds and changes nothing, so this runs on every start of the pod. Then it
# idles until the pod stops (a container that exits would be restarted).
#
# The replicator container keeps `exec` in its entrypoint, so SIGTERM reaches the
# replicator directly and drains it; this container only exits on SIGTERM.
set -eu
# SIGTERM (to this shell, the container's PID 1) ends it at once, whatever it does.
trap 'exit 0' TERM INT

# pod, ordinal, node_id, domain and fqdn (pod.sh, mounted beside this script).
script=join
. "$(dirname "$0")/pod.sh"
initial="${INITIAL_MEMBERS:-3}"
statefulset="${pod%-*}"
interval="${JOIN_RETRY_INTERVAL:-5}"

idle() {
  while :; do
    sleep 3600 &
    wait $! || true
  done
}

if [ "$ordinal" -lt "$initial" ]; then
  echo "join: $pod is founding member $node_id (initial_members); nothing to join" >&2
  idle
fi

# The CLI reads REPLICATOR_TOKEN (mutating calls) and REPLICATOR_CA_FILE (an
# HTTPS admin API) from the environment.
tries=0
until iggy-replicator cluster status --api "$fqdn:7180" > /dev/null 2>&1; do
  tries=$((tries + 1))
  if [ $((tries % 30)) -eq 0 ]; then
    echo "join: waiting for the admin API of $pod at $fqdn:7180" >&2
  fi
  sleep 2
done

attempt=0
while :; do
  member="$statefulset-$((attempt % initial))"
  attempt=$((attempt + 1))
  echo "join: adding node $node_id through $member (attempt $attempt)" >&2
  if iggy-replicator cluster add --api "$member.$domain:7180" --id "$node_id" \
    --raft-addr "$fqdn:7100" --api-addr "$fqdn:7180"; then
    echo "join: node $node_id is a voter" >&2
    idle
  fi
  sleep "$interval"
done
