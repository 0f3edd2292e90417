//! Turns a polled batch into the downstream messages, in place: the pure hot path of the
//! writer (the criterion bench `hot_path` drives it through `bench_support`).

use replicator_model::Offset;

use crate::datapath::unit::Batch;
use crate::provenance;

/// What [`prepare`] found out about a batch, besides the messages it left in it to send.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// Bytes of the messages to send (64-byte header + payload + user headers).
    pub(crate) bytes: u64,
    /// Upstream append time (µs) of the newest message to send.
    pub(crate) newest_timestamp: u64,
}

/// What [`prepare`] needs besides the batch.
pub(crate) struct PrepareParams<'a> {
    /// Last upstream offset already downstream (messages up to it are dropped).
    pub(crate) last_written: Option<Offset>,
    /// Flow's source alias (stamped as provenance source).
    pub(crate) source: &'a str,
    /// Flow's target alias (messages originating there are skipped).
    pub(crate) target: &'a str,
    /// Whether to stamp provenance and apply loop prevention.
    pub(crate) provenance: bool,
    /// The provenance format to stamp.
    pub(crate) format: provenance::Format,
    /// Label of the upstream history copied (`provenance::History::label`).
    pub(crate) history_label: u64,
}

/// Turns a batch into its downstream messages, in place: drops what is already downstream,
/// drops (and counts in `batch.skipped`) messages that originated in the target cluster, keeps
/// id, origin timestamp, payload and user headers byte for byte and appends provenance.
/// In place, because the payloads need not be copied or even reference-counted again: the batch
/// is what gets sent. Preparing a prepared batch again (a retry after a failed send) gives the
/// same messages: provenance is replaced, not added twice. `Err(offset)` if a message's headers
/// would exceed Iggy's limit with provenance added.
pub(crate) fn prepare(
    batch: &mut Batch,
    p: &PrepareParams<'_>,
) -> std::result::Result<Prepared, Offset> {
    let mut out = Prepared {
        bytes: 0,
        newest_timestamp: 0,
    };
    if let Some(last) = p.last_written {
        // Offsets are ascending: what is already downstream is a prefix.
        let done = batch.messages.partition_point(|m| m.offset <= last);
        batch.messages.drain(..done);
    }
    if p.provenance {
        let before = batch.messages.len();
        batch.messages.retain(|m| {
            m.user_headers
                .as_deref()
                .is_none_or(|h| !provenance::find(Some(h)).originated_in(p.target))
        });
        batch.skipped += (before - batch.messages.len()) as u64;
        // One allocation for the provenance of the whole batch (each message's headers are
        // split off it).
        let mut arena =
            bytes::BytesMut::with_capacity(batch.messages.len() * (128 + p.source.len()));
        let stamper = provenance::Stamper::new(p.source, p.history_label, p.format);
        for m in &mut batch.messages {
            let offset = m.offset;
            let stamped = stamper
                .stamp_into(&mut arena, m.user_headers.as_deref(), offset)
                .ok_or(offset)?;
            m.user_headers = Some(stamped);
        }
    }
    for m in &batch.messages {
        out.bytes += m.wire_bytes();
        out.newest_timestamp = out.newest_timestamp.max(m.timestamp);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use assert2::{assert, check};
    use bytes::Bytes;
    use replicator_sdk::Message;

    use super::*;

    fn msg(offset: u64, headers: Option<Bytes>) -> Message {
        let payload = Bytes::from(format!("payload-{offset}"));
        let mut m =
            Message::new(u128::from(offset) + 1000, 5 + offset, payload).with_user_headers(headers);
        m.offset = offset;
        m.timestamp = 10 + offset;
        m
    }

    fn params(last_written: Option<Offset>) -> PrepareParams<'static> {
        PrepareParams {
            last_written,
            source: "us",
            target: "eu",
            provenance: true,
            format: provenance::Format::Entries,
            history_label: 9,
        }
    }

    fn batch(messages: Vec<Message>) -> Batch {
        Batch::new(messages, None).expect("not empty")
    }

    fn offsets(batch: &Batch) -> Vec<u64> {
        batch.messages.iter().map(|m| m.offset).collect()
    }

    #[test]
    fn prepare_drops_what_is_already_downstream() {
        let mut b = batch((10..15).map(|o| msg(o, None)).collect());
        let p = prepare(&mut b, &params(Some(12))).expect("fits");
        check!(offsets(&b) == vec![13, 14]);
        check!(b.last_offset == 14);
        check!(p.newest_timestamp == 24);
    }

    #[test]
    fn prepare_preserves_message_and_stamps_provenance() {
        let original = msg(3, None);
        let mut b = batch(vec![msg(3, None)]);
        let p = prepare(&mut b, &params(None)).expect("fits");
        assert!(b.messages.len() == 1);
        let out = &b.messages[0];
        check!(out.id == 1003);
        check!(out.origin_timestamp == 8);
        check!(out.payload == original.payload);
        let found = provenance::find(out.user_headers.as_deref());
        check!(found.from_source("us"));
        check!(found.offset == Some(3));
        check!(found.history_label == Some(9));
        let headers_len = out.user_headers.as_ref().map_or(0, |h| h.len());
        check!(p.bytes == (64 + original.payload.len() + headers_len) as u64);
    }

    #[test]
    fn preparing_a_prepared_batch_again_changes_nothing() {
        let user = provenance::stamp(
            None,
            &provenance::Stamp {
                source: "ap",
                offset: 77,
                history_label: 1,
                format: provenance::Format::Entries,
            },
        );
        let mut b = batch(vec![msg(1, None), msg(2, user)]);
        let fields = |b: &Batch| -> Vec<(u64, u128, u32, Bytes, Option<Bytes>)> {
            b.messages
                .iter()
                .map(|m| {
                    (
                        m.offset,
                        m.id,
                        m.user_headers_len(),
                        m.payload.clone(),
                        m.user_headers.clone(),
                    )
                })
                .collect()
        };
        prepare(&mut b, &params(None)).expect("fits");
        let once = fields(&b);
        prepare(&mut b, &params(None)).expect("fits");
        check!(fields(&b) == once);
        check!(provenance::find(b.messages[1].user_headers.as_deref()).originated_in("ap"));
    }

    #[test]
    fn prepare_skips_messages_that_originated_in_the_target() {
        let from_eu = provenance::stamp(
            None,
            &provenance::Stamp {
                source: "eu",
                offset: 1,
                history_label: 1,
                format: provenance::Format::Compact,
            },
        );
        let mut b = batch(vec![msg(0, from_eu), msg(1, None)]);
        prepare(&mut b, &params(None)).expect("fits");
        check!(b.skipped == 1);
        check!(offsets(&b) == vec![1]);
        check!(b.last_offset == 1);
    }

    #[test]
    fn prepare_without_provenance_forwards_headers_unchanged() {
        let raw = Bytes::from_static(&[2, 1, 0, 0, 0, b'k', 2, 1, 0, 0, 0, b'v']);
        let mut b = batch(vec![msg(0, Some(raw.clone()))]);
        let mut p = params(None);
        p.provenance = false;
        prepare(&mut b, &p).expect("fits");
        check!(b.messages[0].user_headers == Some(raw));
    }
}
