//! A rolling config change across three nodes while the producer runs: each node's file is
//! rewritten and reloaded in turn (`POST /config/reload`, the last one by SIGHUP). An invalid file is refused with its
//! reasons and changes nothing. While the nodes disagree, the status names the ones that differ
//! from the leader, and they get none of the flow's partitions; after the last reload every
//! partition is owned again, every node agrees and is ready, and `verify` finds an exact copy
//! (a partition written by two nodes at once would show up there as duplicates).

use std::time::Duration;

use replicator_harness::{serial, wait_until, TestResult};

use crate::fixture::{self, finish_with_exact_copy};

const FLOW: &str = "up-to-down";
const WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_rolling_reload_across_three_nodes_keeps_the_copy_exact() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer) = fixture::start(3).await?;
        let units = servers.topic.partitions as usize;

        // A file that does not validate: refused with the key, the running config stays.
        let broken = fixture::replication_toml(&servers, None, "batch_size = 0");
        cluster.rewrite_replication(1, &broken)?;
        let (code, body) = cluster.reload(1).await?;
        println!("invalid reload: {code} {body}");
        assert_eq!(code, 422, "{body}");
        assert!(body.contains("batch_size"), "{body}");

        // The change: the flow copies in smaller batches (its digest changes).
        let changed = fixture::replication_toml(&servers, None, "batch_size = 50");
        for node in [1, 2, 3] {
            cluster.rewrite_replication(node, &changed)?;
            if node == 3 {
                // The last one by SIGHUP: no answer, the status tells when it is done.
                cluster.hangup(node)?;
            } else {
                let (code, body) = cluster.reload(node).await?;
                println!("reload of node {node}: {code} {body}");
                assert_eq!(code, 200, "{body}");
                assert!(body.contains(&format!("changed {FLOW}")), "{body}");
            }
            if node < 3 {
                wait_until("the status names the nodes that disagree", WAIT, || async {
                    cluster
                        .leader_status()
                        .await
                        .is_some_and(|s| s.members.iter().any(|m| m.config_disagrees == [FLOW]))
                })
                .await?;
                // A node that disagrees is not ready, and says why.
                wait_until(
                    "a disagreeing node answers /ready with 503",
                    WAIT,
                    || async {
                        for id in [1, 2, 3] {
                            if let Ok((503, body)) = cluster.ready_answer(id).await {
                                if body.contains("differs from the leader's") {
                                    return true;
                                }
                            }
                        }
                        false
                    },
                )
                .await?;
            }
            // Whatever agrees with the leader owns every partition again.
            wait_until(
                "every partition owned by an agreeing node",
                WAIT,
                || async {
                    cluster.leader_status().await.is_some_and(|s| {
                        let agreeing: Vec<_> = s
                            .members
                            .iter()
                            .filter(|m| m.config_disagrees.is_empty())
                            .map(|m| m.id)
                            .collect();
                        s.all_units_owned_by_any_of(&agreeing, units)
                    })
                },
            )
            .await?;
        }
        wait_until("every node agrees and owns partitions", WAIT, || async {
            cluster.leader_status().await.is_some_and(|s| {
                s.members.iter().all(|m| m.config_disagrees.is_empty())
                    && s.all_units_owned_by_any_of(&[1, 2, 3], units)
            })
        })
        .await?;
        for node in [1, 2, 3] {
            let status = cluster.status_of(node).await?;
            assert!(status.members.iter().all(|m| m.config_disagrees.is_empty()));
            wait_until(&format!("node {node} ready"), WAIT, || async {
                matches!(cluster.ready_answer(node).await, Ok((200, _)))
            })
            .await?;
        }
        // Reloading the same file again changes nothing.
        let (code, body) = cluster.reload(2).await?;
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("nothing changed"), "{body}");
        finish_with_exact_copy(producer, servers, cluster).await
    })
}
