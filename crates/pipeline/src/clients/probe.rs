//! Which protocol generation a cluster's server answers in. The two generations do not
//! understand each other: an SDK of the wrong one gets no answer at all (a 0.9 server waits for
//! the rest of a 256-byte header that never comes) or an answer it cannot read, which without
//! this check looks like a server that merely does not respond. So at start every cluster is
//! sent a PING, which both generations answer before a login, in its configured generation and,
//! when that gets no answer, in the other one.

use std::collections::BTreeMap;
use std::time::Duration;

use replicator_model::IggyVersion;

use replicator_sdk::ClientConfig;
use replicator_sdk::IggyCluster as _;

use crate::params::ClusterParams;

/// How long one PING may take before the server counts as not answering in that generation.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What a cluster answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spoken {
    /// It answered in the configured generation.
    Configured,
    /// It answered only in this other generation.
    Other(IggyVersion),
    /// It answered in neither (down, unreachable, or too slow): nothing can be said yet.
    Unknown,
}

/// The verdict from the two PINGs (pure).
fn verdict(configured: IggyVersion, configured_answered: bool, other_answered: bool) -> Spoken {
    match (configured_answered, other_answered) {
        (true, _) => Spoken::Configured,
        (false, true) => Spoken::Other(other(configured)),
        (false, false) => Spoken::Unknown,
    }
}

fn other(version: IggyVersion) -> IggyVersion {
    match version {
        IggyVersion::V0_8 => IggyVersion::V0_9,
        IggyVersion::V0_9 => IggyVersion::V0_8,
    }
}

/// Whether a server at one of the seed addresses of `connection_string` answers a PING in
/// `version` within `wait` (each address in turn).
async fn answers(version: IggyVersion, connection_string: &str, wait: Duration) -> bool {
    for seed in replicator_model::seed_urls(connection_string) {
        if answers_at(version, &seed, wait).await {
            return true;
        }
    }
    false
}

/// Whether the server at the one address of `connection_string` answers a PING in `version`.
async fn answers_at(version: IggyVersion, connection_string: &str, wait: Duration) -> bool {
    let Ok(config) = ClientConfig::parse(version, connection_string) else {
        return false;
    };
    let Ok(client) = config.without_login().client() else {
        return false;
    };
    // Without the SDK's heartbeat: its timer would fire on the client after the shutdown
    // below and log an error (at every start of every node).
    let answered = tokio::time::timeout(wait, async {
        client.connect_without_heartbeat().await.is_ok() && client.ping().await.is_ok()
    })
    .await
    .unwrap_or(false);
    let _ = tokio::time::timeout(Duration::from_secs(1), client.shutdown()).await;
    answered
}

/// Probes one cluster. The configured generation first: a server that answers it within half
/// of `wait` (every healthy one, even across a continent) is never sent the other generation's
/// request, which it could not answer (the 0.9 SDK then waits 30 s on that connection and logs
/// an error). After that half both run, so a server that answers neither (down, frozen) costs
/// about one and a half `wait`s, not two.
pub async fn probe(cluster: &ClusterParams, wait: Duration) -> Spoken {
    let configured = cluster.iggy_version;
    let configured_probe = answers(configured, &cluster.connection_string, wait);
    tokio::pin!(configured_probe);
    let head_start = tokio::time::sleep(wait / 2);
    let decided = tokio::select! {
        answered = &mut configured_probe => Some(answered),
        () = head_start => None,
    };
    let other_probe = answers(other(configured), &cluster.connection_string, wait);
    match decided {
        Some(true) => return Spoken::Configured,
        // Refused or unreadable before the head start ran out: only the other one is left.
        Some(false) => return verdict(configured, false, other_probe.await),
        None => {}
    }
    tokio::pin!(other_probe);
    let mut other_answered = None;
    let configured_answered = loop {
        tokio::select! {
            answered = &mut configured_probe => break answered,
            answered = &mut other_probe, if other_answered.is_none() => {
                other_answered = Some(answered);
            }
        }
    };
    if configured_answered {
        return Spoken::Configured;
    }
    let other_answered = match other_answered {
        Some(answered) => answered,
        None => other_probe.await,
    };
    verdict(configured, false, other_answered)
}

/// A cluster that answers in another generation than its config says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationMismatch {
    /// The cluster alias.
    pub alias: String,
    /// `clusters.<alias>.iggy_version`.
    pub configured: IggyVersion,
    /// The generation its server answered in.
    pub spoken: IggyVersion,
}

impl std::fmt::Display for GenerationMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "clusters.{alias}: the server answers in the Iggy {spoken} protocol, but \
             clusters.{alias}.iggy_version is \"{configured}\" (set iggy_version = \"{spoken}\")",
            alias = self.alias,
            spoken = self.spoken,
            configured = self.configured,
        )
    }
}

/// Probes every cluster at once and returns those that answer in the other generation. A
/// cluster that answers in neither is left to the usual retries (it may be starting).
pub async fn check_generations(
    clusters: &BTreeMap<String, ClusterParams>,
    wait: Duration,
) -> Vec<GenerationMismatch> {
    let probes = clusters.iter().map(|(alias, cluster)| async move {
        match probe(cluster, wait).await {
            Spoken::Other(spoken) => Some(GenerationMismatch {
                alias: alias.clone(),
                configured: cluster.iggy_version,
                spoken,
            }),
            Spoken::Unknown => {
                tracing::warn!(
                    cluster = %alias,
                    iggy_version = %cluster.iggy_version,
                    "the cluster answered a PING in neither Iggy protocol generation; going on, \
                     its connections retry"
                );
                None
            }
            Spoken::Configured => None,
        }
    });
    futures::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    #[test]
    fn the_other_generation_is_named_only_when_it_alone_answered() {
        let v08 = IggyVersion::V0_8;
        check!(verdict(v08, true, false) == Spoken::Configured);
        check!(verdict(v08, true, true) == Spoken::Configured);
        check!(verdict(v08, false, true) == Spoken::Other(IggyVersion::V0_9));
        check!(verdict(IggyVersion::V0_9, false, true) == Spoken::Other(v08));
        check!(verdict(v08, false, false) == Spoken::Unknown);
    }

    #[test]
    fn a_mismatch_names_the_key_and_the_value_to_set() {
        let m = GenerationMismatch {
            alias: "eu".into(),
            configured: IggyVersion::V0_8,
            spoken: IggyVersion::V0_9,
        };
        let text = m.to_string();
        check!(text.contains("clusters.eu.iggy_version is \"0.8\""));
        check!(text.contains("iggy_version = \"0.9\""));
    }
}
