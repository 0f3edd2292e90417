//! Consumer groups as an application uses them, for the disaster-recovery scenarios: a group
//! that consumed up to some offsets, the offset a group stored, the message at an offset.

use iggy::prelude::{Consumer, Identifier, Partitioning, PollingStrategy};
use replicator_sdk::Client;
use replicator_sdk::IggyCluster as _;

use crate::error::{Error, Result};

/// Stores `offsets` (partition, last processed offset) for `group` on `stream/topic`, creating
/// the group if needed, as its only member for the moment (Iggy stores a group's offset only
/// from a member the partition is assigned to), then leaves.
pub async fn store_group_offsets(
    client: &Client,
    (stream, topic): (&str, &str),
    group: &str,
    offsets: &[(u32, u64)],
) -> Result<()> {
    let (s, t, g) = (
        Identifier::named(stream)?,
        Identifier::named(topic)?,
        Identifier::named(group)?,
    );
    if client.get_consumer_group(&s, &t, &g).await?.is_none() {
        client.create_consumer_group(&s, &t, group).await?;
    }
    client.join_consumer_group(&s, &t, &g).await?;
    let consumer = Consumer::group(g.clone());
    let mut stored = Ok(());
    for &(partition, offset) in offsets {
        stored = client
            .store_consumer_offset(&consumer, &s, &t, Some(partition), offset)
            .await;
        if stored.is_err() {
            break;
        }
    }
    client.leave_consumer_group(&s, &t, &g).await?;
    Ok(stored?)
}

/// The offset `group` stored on `partition` of `stream/topic` (reading needs no membership).
pub async fn group_offset(
    client: &Client,
    (stream, topic): (&str, &str),
    group: &str,
    partition: u32,
) -> Result<Option<u64>> {
    let info = client
        .get_consumer_offset(
            &Consumer::group(Identifier::named(group)?),
            &Identifier::named(stream)?,
            &Identifier::named(topic)?,
            Some(partition),
        )
        .await?;
    Ok(info.map(|i| i.stored_offset))
}

/// The id of the message at `offset` of `stream/topic/partition`.
pub async fn message_id_at(
    client: &Client,
    (stream, topic): (&str, &str),
    partition: u32,
    offset: u64,
) -> Result<u128> {
    let polled = client
        .poll_messages(
            &Identifier::named(stream)?,
            &Identifier::named(topic)?,
            Some(partition),
            &Consumer::new(Identifier::named("harness-reader")?),
            &PollingStrategy::offset(offset),
            1,
            false,
        )
        .await?;
    polled
        .messages
        .first()
        .filter(|m| m.offset == offset)
        .map(|m| m.id)
        .ok_or_else(|| Error::Command {
            command: format!("read {stream}/{topic}/{partition} at {offset}"),
            detail: "no message there".into(),
        })
}

/// Whether `group` on the target stored, on `partition`, the offset of the copy of the message
/// at `upstream_offset` upstream: the message there has the same id.
pub async fn translated_exactly(
    (upstream, downstream): (&Client, &Client),
    (stream, topic): (&str, &str),
    group: &str,
    partition: u32,
    upstream_offset: u64,
) -> Result<bool> {
    let want = message_id_at(upstream, (stream, topic), partition, upstream_offset).await?;
    let Some(offset) = group_offset(downstream, (stream, topic), group, partition).await? else {
        return Ok(false);
    };
    Ok(
        message_id_at(downstream, (stream, topic), partition, offset)
            .await
            .is_ok_and(|got| got == want),
    )
}

/// The message `group` reads next on `partition` of `stream/topic` (joins, polls with
/// `next()` without committing, leaves), as an application that starts on this cluster would.
pub async fn group_next_message(
    client: &Client,
    (stream, topic): (&str, &str),
    group: &str,
    partition: u32,
) -> Result<Option<replicator_sdk::Message>> {
    let (s, t, g) = (
        Identifier::named(stream)?,
        Identifier::named(topic)?,
        Identifier::named(group)?,
    );
    client.join_consumer_group(&s, &t, &g).await?;
    let polled = client
        .poll_messages(
            &s,
            &t,
            Some(partition),
            &Consumer::group(g.clone()),
            &PollingStrategy::next(),
            1,
            false,
        )
        .await;
    client.leave_consumer_group(&s, &t, &g).await?;
    Ok(polled?.messages.into_iter().next())
}

/// Appends the messages at offsets `from..from + count` of `stream/topic/partition` once more
/// at its end, unchanged (payload, user headers, id): what a batch whose send timed out looks
/// like when it lands late, after the copy went on without it (for example with fencing off).
/// Returns how many were appended.
pub async fn append_again(
    client: &Client,
    (stream, topic): (&str, &str),
    partition: u32,
    from: u64,
    count: u32,
) -> Result<usize> {
    let (s, t) = (Identifier::named(stream)?, Identifier::named(topic)?);
    let polled = client
        .poll_messages(
            &s,
            &t,
            Some(partition),
            &Consumer::new(Identifier::named("harness-reader")?),
            &PollingStrategy::offset(from),
            count,
            false,
        )
        .await?;
    // Sent as polled, as the writer sends what it polled: the server assigns new offsets.
    let mut again = polled.messages;
    client
        .send_messages(&s, &t, &Partitioning::partition_id(partition), &mut again)
        .await?;
    Ok(again.len())
}
