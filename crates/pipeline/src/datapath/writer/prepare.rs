//! Turns a polled batch into the downstream messages, in place: the pure hot path of the
//! writer (the criterion bench `hot_path` drives it through `bench_support`).

use replicator_model::Offset;
use replicator_sdk::Message;

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

impl Prepared {
    /// Counts `m`, sent with a tail of `tail` bytes.
    fn add(&mut self, m: &Message, tail: usize) {
        self.bytes += m.wire_bytes() + tail as u64;
        self.newest_timestamp = self.newest_timestamp.max(m.timestamp);
    }
}

/// What [`prepare`] needs besides the batch.
pub(crate) struct PrepareParams<'a> {
    /// Last upstream offset already downstream (messages up to it are dropped).
    pub(crate) last_written: Option<Offset>,
    /// Flow's target alias (messages originating there are skipped).
    pub(crate) target: &'a str,
    /// The provenance the send appends (`None`: provenance off, and no loop prevention).
    pub(crate) stamper: Option<&'a provenance::Stamper<'a>>,
}

/// Turns a batch into its downstream messages, in place: drops what is already downstream,
/// drops (and counts in `batch.skipped`) messages that originated in the target cluster, keeps
/// id, origin timestamp, payload and user headers byte for byte. Provenance is the send's to
/// append ([`provenance::Stamper`] is its tail, written straight into the request), except on
/// a message that already carries provenance (a copy of another hop, or a retry's batch an
/// adapter applied tails to): its provenance is rewritten here, which leaves it none for the
/// tail to add. So preparing a prepared batch again gives the same messages. `Err(offset)` if a
/// message's headers would exceed Iggy's limit with provenance added.
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
    let Some(stamper) = p.stamper else {
        for m in &batch.messages {
            out.add(m, 0);
        }
        return Ok(out);
    };
    // One pass: loop prevention, provenance to rewrite, the sizes with the tails to come.
    let before = batch.messages.len();
    let mut refused = None;
    let mut arena = bytes::BytesMut::new();
    batch.messages.retain_mut(|m| {
        let offset = m.offset;
        let Some(existing) = m.user_headers.as_deref() else {
            out.add(m, stamper.tail_len(offset));
            return true;
        };
        if refused.is_some() {
            return true;
        }
        if provenance::find(Some(existing)).originated_in(p.target) {
            return false;
        }
        if !provenance::has_ours(existing) {
            if existing.len() + stamper.tail_len(offset) > provenance::MAX_USER_HEADERS_SIZE {
                refused = Some(offset);
            }
            out.add(m, stamper.tail_len(offset));
            return true;
        }
        match stamper.stamp_into(&mut arena, Some(existing), offset) {
            Some(stamped) => m.user_headers = Some(stamped),
            None => refused = Some(offset),
        }
        out.add(m, 0);
        true
    });
    if let Some(offset) = refused {
        return Err(offset);
    }
    batch.skipped += (before - batch.messages.len()) as u64;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use assert2::{assert, check};
    use bytes::Bytes;
    use replicator_sdk::Message;

    use super::*;
    use crate::provenance::{Format, Stamper};

    fn msg(offset: u64, headers: Option<Bytes>) -> Message {
        let payload = Bytes::from(format!("payload-{offset}"));
        let mut m =
            Message::new(u128::from(offset) + 1000, 5 + offset, payload).with_user_headers(headers);
        m.offset = offset;
        m.timestamp = 10 + offset;
        m
    }

    fn stamper(format: Format) -> Stamper<'static> {
        Stamper::new("us", 9, format)
    }

    fn params<'a>(last_written: Option<Offset>, stamper: &'a Stamper<'a>) -> PrepareParams<'a> {
        PrepareParams {
            last_written,
            target: "eu",
            stamper: Some(stamper),
        }
    }

    fn batch(messages: Vec<Message>) -> Batch {
        Batch::new(messages, None).expect("not empty")
    }

    fn offsets(batch: &Batch) -> Vec<u64> {
        batch.messages.iter().map(|m| m.offset).collect()
    }

    /// What lands downstream: the batch's messages with the send's tails.
    fn landed(batch: &Batch, stamper: &Stamper<'_>) -> Vec<Message> {
        let mut messages = batch.messages.clone();
        replicator_sdk::apply_tail(&mut messages, stamper);
        messages
    }

    #[test]
    fn prepare_drops_what_is_already_downstream() {
        let s = stamper(Format::Entries);
        let mut b = batch((10..15).map(|o| msg(o, None)).collect());
        let p = prepare(&mut b, &params(Some(12), &s)).expect("fits");
        check!(offsets(&b) == vec![13, 14]);
        check!(b.last_offset == 14);
        check!(p.newest_timestamp == 24);
    }

    #[test]
    fn prepare_preserves_message_and_the_send_stamps_provenance() {
        for format in [Format::Entries, Format::Compact] {
            let s = stamper(format);
            let original = msg(3, None);
            let mut b = batch(vec![msg(3, None)]);
            let p = prepare(&mut b, &params(None, &s)).expect("fits");
            check!(
                b.messages == vec![original.clone()],
                "the batch stays as polled"
            );
            let out = &landed(&b, &s)[0];
            check!(out.id == 1003);
            check!(out.origin_timestamp == 8);
            check!(out.payload == original.payload);
            let found = provenance::find(out.user_headers.as_deref());
            check!(found.from_source("us"));
            check!(found.offset == Some(3));
            check!(found.history_label == Some(9));
            check!(p.bytes == out.wire_bytes(), "counts the tail");
        }
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
        let s = stamper(Format::Compact);
        let mut b = batch(vec![msg(1, None), msg(2, user)]);
        let first = prepare(&mut b, &params(None, &s)).expect("fits");
        let once = landed(&b, &s);
        let again = prepare(&mut b, &params(None, &s)).expect("fits");
        check!(landed(&b, &s) == once);
        check!(again.bytes == first.bytes);
        check!(provenance::find(once[1].user_headers.as_deref()).originated_in("ap"));
        check!(provenance::find(once[1].user_headers.as_deref()).from_source("us"));
        // A batch an adapter applied the tails to (a 0.9 send that failed) is prepared again
        // into the same messages, and no second tail is written.
        b.messages = once.clone();
        let retried = prepare(&mut b, &params(None, &s)).expect("fits");
        check!(landed(&b, &s) == once);
        check!(retried.bytes == first.bytes);
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
        let s = stamper(Format::Entries);
        let mut b = batch(vec![msg(0, from_eu), msg(1, None)]);
        prepare(&mut b, &params(None, &s)).expect("fits");
        check!(b.skipped == 1);
        check!(offsets(&b) == vec![1]);
        check!(b.last_offset == 1);
    }

    #[test]
    fn headers_that_would_exceed_the_limit_with_provenance_are_refused() {
        let s = stamper(Format::Compact);
        let room = provenance::MAX_USER_HEADERS_SIZE - s.tail_len(4);
        let fits = Bytes::from(vec![0u8; room]);
        let mut b = batch(vec![msg(4, Some(fits))]);
        assert!(prepare(&mut b, &params(None, &s)).is_ok());
        let too_long = Bytes::from(vec![0u8; room + 1]);
        let mut b = batch(vec![msg(3, None), msg(4, Some(too_long))]);
        check!(prepare(&mut b, &params(None, &s)).err() == Some(4));
    }

    #[test]
    fn prepare_without_provenance_forwards_headers_unchanged() {
        let raw = Bytes::from_static(&[2, 1, 0, 0, 0, b'k', 2, 1, 0, 0, 0, b'v']);
        let mut b = batch(vec![msg(0, Some(raw.clone()))]);
        let p = PrepareParams {
            last_written: None,
            target: "eu",
            stamper: None,
        };
        prepare(&mut b, &p).expect("fits");
        check!(b.messages[0].user_headers == Some(raw));
    }
}
