# Sourced by entrypoint.sh and by the Helm chart's join.sh, from their own
# directory: who this pod is in the StatefulSet. Sets
#   pod      its name (POD_NAME, else HOSTNAME), e.g. iggy-replicator-2
#   ordinal  its ordinal, e.g. 2
#   node_id  its [node] id: the ordinal + 1
#   domain   the Raft Service's DNS domain, e.g. iggy-replicator-raft.replication.svc
#   fqdn     this pod's stable name there (its Raft and admin API host)
# and exits 2 when the pod name ends in no ordinal. The sourcing script sets
# `script`, the word its messages start with.
pod="${POD_NAME:-${HOSTNAME:-}}"
ordinal="${pod##*-}"
case "$ordinal" in
  '' | *[!0-9]*)
    echo "$script: cannot derive the pod ordinal from pod name '$pod'" >&2
    exit 2
    ;;
esac
node_id=$((ordinal + 1))
domain="${RAFT_SERVICE:-iggy-replicator-raft}.${POD_NAMESPACE:-default}.svc"
fqdn="$pod.$domain"
