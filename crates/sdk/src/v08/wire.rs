//! A poll's answer read, and a send's request written, straight from and into the replicator's
//! own [`Message`]s, in Iggy 0.8's layout (SDK 0.10's `message_layout`).
//!
//! Why not the SDK's `poll_messages` and `send_messages`: they go through the SDK's own
//! `IggyMessage`, so a copied message was converted four times per hop (answer → SDK message
//! → ours, then ours lent to an SDK message → the SDK's `RawMessage` → request), each a pass
//! over the batch with its own vector, and every header sliced off the answer with a reference
//! count of its own. Here a message is read once and written once. The unit tests hold both
//! directions to the SDK's own decoder and encoder, byte for byte.

use bytes::{BufMut as _, Bytes, BytesMut};
use iggy::prelude::IggyError;
use iggy_binary_protocol::message_layout::{
    MSG_ID_OFFSET, MSG_OFFSET_OFFSET, MSG_ORIGIN_TIMESTAMP_OFFSET, MSG_PAYLOAD_LEN_OFFSET,
    MSG_TIMESTAMP_OFFSET, MSG_USER_HEADERS_LEN_OFFSET, WIRE_MESSAGE_HEADER_SIZE,
    WIRE_MESSAGE_INDEX_SIZE,
};
use iggy_binary_protocol::{WireEncode as _, WireIdentifier, WirePartitioning};

use crate::{HeadersTail, Message, Polled};

/// A poll's answer starts with the partition (u32), its current offset (u64) and the count of
/// messages (u32).
const POLLED_PREFIX: usize = 16;

/// Reads a poll's answer: its messages share `answer`'s memory (payload and user headers are
/// slices of it). An answer that ends inside a message, or holds fewer messages than it says,
/// is an error (`InvalidFormat`): a poll answered in part must not look like a shorter batch.
/// An empty answer (a server with nothing to say) is an empty poll.
pub(crate) fn decode_polled(answer: &Bytes) -> Result<Polled, IggyError> {
    if answer.is_empty() {
        return Ok(Polled::default());
    }
    if answer.len() < POLLED_PREFIX {
        return Err(IggyError::InvalidFormat);
    }
    let count = u32_at(answer, 12);
    let mut polled = Polled {
        partition: u32_at(answer, 0),
        current_offset: u64_at(answer, 4),
        messages: Vec::with_capacity(count as usize),
    };
    let mut at = POLLED_PREFIX;
    while at < answer.len() {
        let header = answer
            .get(at..at + WIRE_MESSAGE_HEADER_SIZE)
            .ok_or(IggyError::InvalidFormat)?;
        let payload_len = u32_at(header, MSG_PAYLOAD_LEN_OFFSET) as usize;
        let headers_len = u32_at(header, MSG_USER_HEADERS_LEN_OFFSET) as usize;
        let payload_at = at + WIRE_MESSAGE_HEADER_SIZE;
        let headers_at = payload_at + payload_len;
        let end = headers_at + headers_len;
        if end > answer.len() {
            return Err(IggyError::InvalidFormat);
        }
        polled.messages.push(Message {
            id: u128::from_le_bytes(field(header, MSG_ID_OFFSET)),
            offset: u64_at(header, MSG_OFFSET_OFFSET),
            timestamp: u64_at(header, MSG_TIMESTAMP_OFFSET),
            origin_timestamp: u64_at(header, MSG_ORIGIN_TIMESTAMP_OFFSET),
            payload: answer.slice(payload_at..headers_at),
            user_headers: (headers_len > 0).then(|| answer.slice(headers_at..end)),
        });
        at = end;
    }
    if polled.messages.len() != count as usize {
        return Err(IggyError::InvalidFormat);
    }
    Ok(polled)
}

/// The request of a send of `messages` to `partitioning` of `stream`/`topic`, each message's
/// user headers followed by its `tail`, if any: what SDK 0.10's `SendMessagesEncoder` writes
/// (metadata, one index entry per message with its end, then each message: a header whose
/// checksum, offset, timestamp and reserved field are the server's to fill, the payload, the
/// user headers). One allocation, sized for the longest tails.
pub(crate) fn encode_send(
    stream: &WireIdentifier,
    topic: &WireIdentifier,
    partitioning: &WirePartitioning,
    messages: &[Message],
    tail: Option<&dyn HeadersTail>,
) -> Bytes {
    let metadata = stream.encoded_size() + topic.encoded_size() + partitioning.encoded_size() + 4;
    let bodies: u64 = messages.iter().map(Message::wire_bytes).sum();
    let tails = tail.map_or(0, |t| t.max_tail_len() * messages.len());
    let mut buf = BytesMut::with_capacity(
        4 + metadata + messages.len() * WIRE_MESSAGE_INDEX_SIZE + bodies as usize + tails,
    );
    // Lengths on the wire are u32: a request is bounded far below 4 GiB by both ends.
    buf.put_u32_le(metadata as u32);
    stream.encode(&mut buf);
    topic.encode(&mut buf);
    partitioning.encode(&mut buf);
    buf.put_u32_le(messages.len() as u32);
    // The index: each entry's message offset in the batch and time are the server's; its
    // end (u32 at 4) is filled in once the message is written and its length known.
    let index_at = buf.len();
    buf.put_bytes(0, messages.len() * WIRE_MESSAGE_INDEX_SIZE);
    let first = buf.len();
    for (i, m) in messages.iter().enumerate() {
        let at = buf.len();
        let mut header = [0u8; WIRE_MESSAGE_HEADER_SIZE];
        header[MSG_ID_OFFSET..MSG_ID_OFFSET + 16].copy_from_slice(&m.id.to_le_bytes());
        header[MSG_ORIGIN_TIMESTAMP_OFFSET..MSG_ORIGIN_TIMESTAMP_OFFSET + 8]
            .copy_from_slice(&m.origin_timestamp.to_le_bytes());
        header[MSG_PAYLOAD_LEN_OFFSET..MSG_PAYLOAD_LEN_OFFSET + 4]
            .copy_from_slice(&(m.payload.len() as u32).to_le_bytes());
        buf.extend_from_slice(&header);
        buf.extend_from_slice(&m.payload);
        let headers_at = buf.len();
        if let Some(headers) = &m.user_headers {
            buf.extend_from_slice(headers);
        }
        if let Some(tail) = tail {
            tail.write_tail(m, &mut buf);
        }
        let headers_len = (buf.len() - headers_at) as u32;
        let len_at = at + MSG_USER_HEADERS_LEN_OFFSET;
        buf[len_at..len_at + 4].copy_from_slice(&headers_len.to_le_bytes());
        let end = (buf.len() - first) as u32;
        let end_at = index_at + i * WIRE_MESSAGE_INDEX_SIZE + 4;
        buf[end_at..end_at + 4].copy_from_slice(&end.to_le_bytes());
    }
    buf.freeze()
}

fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(field(bytes, at))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(field(bytes, at))
}

#[cfg(test)]
mod tests {
    use assert2::{assert, check};
    use iggy::prelude::{Identifier, IggyMessage, Partitioning, PolledMessages};
    use iggy_binary_protocol::requests::messages::{RawMessage, SendMessagesEncoder};
    use iggy_common::wire_conversions::{identifier_to_wire, partitioning_to_wire};

    use super::*;

    /// Messages as a server holds them: some with user headers, one with an empty payload.
    fn stored() -> Vec<Message> {
        (0..5u64)
            .map(|i| {
                let payload = Bytes::from(vec![b'a' + i as u8; (i * 7) as usize]);
                let headers = (i % 2 == 1).then(|| Bytes::from(vec![i as u8; 12 + i as usize]));
                Message {
                    id: u128::from(i) << 70 | 3,
                    offset: 100 + i,
                    timestamp: 5_000 + i,
                    origin_timestamp: 4_000 + i,
                    payload,
                    user_headers: headers,
                }
            })
            .collect()
    }

    /// A poll's answer as a 0.8 server writes it (the layout `decode_polled` reads).
    fn answer(partition: u32, current: u64, messages: &[Message]) -> BytesMut {
        let mut out = BytesMut::new();
        out.put_u32_le(partition);
        out.put_u64_le(current);
        out.put_u32_le(messages.len() as u32);
        for m in messages {
            out.put_u64_le(0xc0ffee);
            out.put_u128_le(m.id);
            out.put_u64_le(m.offset);
            out.put_u64_le(m.timestamp);
            out.put_u64_le(m.origin_timestamp);
            out.put_u32_le(m.user_headers_len());
            out.put_u32_le(m.payload.len() as u32);
            out.put_u64_le(0);
            out.put_slice(&m.payload);
            if let Some(h) = &m.user_headers {
                out.put_slice(h);
            }
        }
        out
    }

    #[test]
    fn a_poll_reads_as_the_sdk_reads_it() {
        let bytes = answer(3, 104, &stored()).freeze();
        let ours = decode_polled(&bytes).expect("well formed");
        let sdk = PolledMessages::from_bytes(bytes.clone()).expect("well formed");
        check!(ours.partition == sdk.partition_id);
        check!(ours.current_offset == sdk.current_offset);
        let sdk: Vec<Message> = sdk.messages.into_iter().map(Message::from).collect();
        check!(ours.messages == sdk);
        check!(ours.messages == stored());
    }

    #[test]
    fn an_empty_answer_is_an_empty_poll_and_no_messages_is_none() {
        check!(decode_polled(&Bytes::new()).expect("empty") == Polled::default());
        let none = decode_polled(&answer(2, 9, &[]).freeze()).expect("well formed");
        check!(none.partition == 2);
        check!(none.current_offset == 9);
        check!(none.messages.is_empty());
    }

    #[test]
    fn an_answer_cut_short_or_miscounted_is_an_error() {
        let whole = answer(0, 104, &stored());
        for cut in [5, POLLED_PREFIX + 10, whole.len() - 1] {
            let short = whole.clone().freeze().slice(..cut);
            check!(decode_polled(&short).is_err(), "cut at {cut}");
        }
        let mut miscounted = whole;
        miscounted[12..16].copy_from_slice(&6u32.to_le_bytes());
        check!(decode_polled(&miscounted.freeze()).is_err());
    }

    #[test]
    fn a_send_writes_what_the_sdk_writes() {
        let messages = stored();
        let stream = identifier_to_wire(&Identifier::named("orders").unwrap()).unwrap();
        let topic = identifier_to_wire(&Identifier::numeric(7).unwrap()).unwrap();
        for to in [Partitioning::partition_id(4), Partitioning::balanced()] {
            let to = partitioning_to_wire(&to).unwrap();
            let raw: Vec<RawMessage<'_>> = messages
                .iter()
                .map(|m| RawMessage {
                    id: m.id,
                    origin_timestamp: m.origin_timestamp,
                    headers: m.user_headers.as_deref(),
                    payload: &m.payload,
                })
                .collect();
            let mut sdk = BytesMut::new();
            SendMessagesEncoder::encode(&mut sdk, &stream, &topic, &to, &raw);
            let ours = encode_send(&stream, &topic, &to, &messages, None);
            assert!(ours == sdk.freeze());
        }
    }

    #[test]
    fn a_sent_message_keeps_id_origin_payload_and_headers() {
        // The SDK's own message as a producer builds it, through our request and back.
        let m: Message = IggyMessage::builder()
            .id(42)
            .payload(Bytes::from_static(b"hello"))
            .build()
            .expect("valid")
            .into();
        let m = m.with_user_headers(Some(Bytes::from_static(b"hdrs")));
        let stream = identifier_to_wire(&Identifier::numeric(1).unwrap()).unwrap();
        let to = partitioning_to_wire(&Partitioning::partition_id(0)).unwrap();
        let request = encode_send(&stream, &stream, &to, std::slice::from_ref(&m), None);
        let body = &request[request.len() - (64 + 5 + 4)..];
        check!(u128::from_le_bytes(field(body, MSG_ID_OFFSET)) == 42);
        check!(u64_at(body, MSG_ORIGIN_TIMESTAMP_OFFSET) == m.origin_timestamp);
        check!(&body[64..69] == b"hello");
        check!(&body[69..] == b"hdrs");
    }

    /// Appends `b"<" offset ">"` to messages without user headers of 3 bytes or more.
    struct Marker;

    impl HeadersTail for Marker {
        fn write_tail(&self, m: &Message, out: &mut BytesMut) {
            if m.user_headers_len() < 3 {
                out.put_u8(b'<');
                out.put_u8(m.offset as u8);
                out.put_u8(b'>');
            }
        }

        fn max_tail_len(&self) -> usize {
            3
        }
    }

    #[test]
    fn a_send_with_a_tail_writes_what_the_sdk_writes_for_the_tails_applied() {
        let mut messages = stored();
        messages[1].user_headers = Some(Bytes::from_static(b"ab"));
        let stream = identifier_to_wire(&Identifier::named("orders").unwrap()).unwrap();
        let to = partitioning_to_wire(&Partitioning::partition_id(1)).unwrap();
        let ours = encode_send(&stream, &stream, &to, &messages, Some(&Marker));
        let mut applied = messages.clone();
        crate::apply_tail(&mut applied, &Marker);
        check!(applied[1].user_headers.as_deref() == Some(&b"ab<\x65>"[..]));
        check!(applied[3].user_headers == messages[3].user_headers);
        check!(ours == encode_send(&stream, &stream, &to, &applied, None));
        // Applied once more, nothing changes (each tail is written once).
        let mut twice = applied.clone();
        crate::apply_tail(&mut twice, &Marker);
        check!(twice == applied);
    }
}
