//! Three nodes with mutual TLS between them and HTTPS admin APIs (certificates of a test CA):
//! they replicate, survive a leader `kill -9`, answer the CLI with `--ca-file`, refuse plain
//! HTTP, and the copy is exact.

use std::time::Duration;

use replicator_harness::{serial, TestResult};

use crate::fixture::{self, finish_with_exact_copy};

#[test]
fn a_tls_cluster_fails_over_and_copies_exactly() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer) = fixture::start_loopback(3, true).await?;
        // The admin API speaks HTTPS only.
        let node = cluster.node(1)?.api_addr;
        let plain = reqwest::Client::new()
            .get(format!("http://{node}/health"))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        assert!(
            plain.is_err() || plain.is_ok_and(|r| !r.status().is_success()),
            "plain http answered"
        );
        // The CLI reaches it with the CA.
        let status = cluster.cluster_status_text(1).await?;
        assert!(
            status.contains("voter"),
            "cluster status over https: {status}"
        );
        // Raft over mTLS carries a leader failover.
        let leader = cluster
            .leader_status()
            .await
            .and_then(|s| s.leader)
            .ok_or("no leader")?;
        let killed = cluster
            .kill_and_wait_resumed(leader, &servers.topic, &servers)
            .await?;
        println!(
            "tls cluster: leader {leader} killed, all partitions written again after {:.2} s",
            killed.resumed.all.as_secs_f64()
        );
        finish_with_exact_copy(producer, servers, cluster).await
    })
}
