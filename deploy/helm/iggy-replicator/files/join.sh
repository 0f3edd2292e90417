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

pod="${POD_NAME:-${HOSTNAME:-}}"
ordinal="${pod##*-}"
case "$ordinal" in
  '' | *[!0-9]*)
    echo "join: cannot derive the pod ordinal from pod name '$pod'" >&2
    exit 2
    ;;
esac
node_id=$((ordinal + 1))
initial="${INITIAL_MEMBERS:-3}"
service="${RAFT_SERVICE:-iggy-replicator-raft}"
domain="$service.${POD_NAMESPACE:-default}.svc"
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

self="$pod.$domain"
# The CLI reads REPLICATOR_TOKEN (mutating calls) and REPLICATOR_CA_FILE (an
# HTTPS admin API) from the environment.
tries=0
until iggy-replicator cluster status --api "$self:7180" > /dev/null 2>&1; do
  tries=$((tries + 1))
  if [ $((tries % 30)) -eq 0 ]; then
    echo "join: waiting for the admin API of $pod at $self:7180" >&2
  fi
  sleep 2
done

attempt=0
while :; do
  member="$statefulset-$((attempt % initial))"
  attempt=$((attempt + 1))
  echo "join: adding node $node_id through $member (attempt $attempt)" >&2
  if iggy-replicator cluster add --api "$member.$domain:7180" --id "$node_id" \
    --raft-addr "$self:7100" --api-addr "$self:7180"; then
    echo "join: node $node_id is a voter" >&2
    idle
  fi
  sleep "$interval"
done
